"""One iteration (argv): per spare server and 10 ms bin, chunks summed / mean wait from first to
last push (ms) / the rank most often last."""
import os
import sys, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load, window
it = int(sys.argv[1])
b0 = load("h3"); t0 = min(barriers(load(h))[it] for h in ["h0","h1","h2","h3"])
for h in ["h4","h5","h6","h7"]:
    ev = load(h)
    begun = {}; rows = []
    for e in ev:
        if e["name"] != "summation server: first to last push": continue
        t = (e["ts"] - t0) / 1000
        if t < 0 or t > 110: continue
        if e["ph"] == "b": begun[e["id"]] = (t, e["args"])
        elif e["id"] in begun:
            tb, a = begun.pop(e["id"]); rows.append((tb, t - tb, a.get("last_rank")))
    rows.sort()
    bins = collections.defaultdict(list)
    for tb, w, r in rows: bins[int(tb // 10)].append((w, r))
    print(h, " ".join(f"{b*10}:{len(v)}/{sum(x for x,_ in v)/len(v):.1f}/{collections.Counter(r for _,r in v).most_common(1)[0][0]}" for b, v in sorted(bins.items())))
