"""One worker's events of one timed iteration's first 12 ms, in ms after its barrier (usage:
gap.py HOST ITERATION); the per-chunk spans are counted per millisecond instead."""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load

host, it = sys.argv[1], int(sys.argv[2])
ev = sorted(load(host), key=lambda e: e["ts"])
start = barriers(ev)[it]
counts = collections.Counter()
for e in ev:
    t = (e["ts"] - start) / 1000
    if not 0 <= t < 12:
        continue
    n = e["name"]
    if n.startswith(("credit", "push s", "wait for")):
        counts[(int(t), " ".join(n.split(" ")[:2]), e["ph"])] += 1
        continue
    print(f"{t:7.2f} {e['ph']} {n[:60]} {str(e.get('args', ''))[:100]}")
for k in sorted(counts):
    print(k, counts[k])
