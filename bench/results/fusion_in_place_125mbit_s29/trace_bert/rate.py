"""One worker, one iteration (argv: host iteration bin_ms): KiB pushed and KiB of sums received per
bin after its barrier."""
import collections, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load, window
h = sys.argv[1]; it = int(sys.argv[2]); w = float(sys.argv[3]) if len(sys.argv) > 3 else 2
ev = load(h); bar = barriers(ev)
b = collections.Counter(); r = collections.Counter()
for e in window(ev, bar, it):
    n = e["name"]
    t = (e["ts"] - bar[it]) / 1000
    if n.startswith("push s") and e["ph"] == "b" and n != "push s4" or (n == "push s4" and e["ph"] == "b" and e["args"]["bytes"] > 100):
        b[int(t // w)] += e["args"]["bytes"] // 1024
    if n.startswith("wait for sum") and e["ph"] == "e":
        r[int(t // w)] += 4
print(h, it, "push KiB per", w, "ms:", [b[i] for i in range(int(110 // w))])
print(h, it, "sums  KiB per", w, "ms:", [r[i] for i in range(int(110 // w))])
