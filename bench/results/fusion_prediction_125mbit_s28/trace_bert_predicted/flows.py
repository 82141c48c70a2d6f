"""Per worker and timed iteration 4-6: per summation server, when the pushes to it began and ended
and the last sum came back (ms after the barrier), and the bytes pushed."""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load, window

for h in ["h0", "h1", "h2", "h3"]:
    ev = load(h)
    bar = barriers(ev)
    for i in range(4, 7):
        first, last, done = {}, collections.defaultdict(float), collections.defaultdict(float)
        sent = collections.defaultdict(int)
        for e in window(ev, bar, i):
            t = (e["ts"] - bar[i]) / 1000
            n = e["name"]
            if n.startswith("push s"):
                s = n[5:]
                if e["ph"] == "b":
                    first.setdefault(s, t)
                    sent[s] += e["args"]["bytes"]
                else:
                    last[s] = max(last[s], t)
            elif n.startswith("wait for sum s") and e["ph"] == "e":
                s = n[13:]
                done[s] = max(done[s], t)
        print(h, i, " ".join(f"{s}: push {first.get(s, 0):.0f}-{last[s]:.0f} sum<= {done[s]:.0f} "
                             f"{sent[s] // 1024}K" for s in sorted(last)))
