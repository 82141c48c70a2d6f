"""Iterations 3-8: per worker (ms after the earliest barrier end), the fusion decision broadcast's
begin and end (decb, dece), and each fused collective's first member here (fus_b) with its last
member and its decision after that (TRACE_DIR: the agents' trace-<host>.json)."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load, window
evs = {h: load(h) for h in ["h0","h1","h2","h3"]}
bars = {h: barriers(evs[h]) for h in evs}
for it in range(3, 9):
    t0 = min(bars[h][it] for h in evs)
    out=[]
    for h in evs:
        items=[]
        for e in window(evs[h], bars[h], it):
            n=e["name"]; t=(e["ts"]-t0)/1000
            if "fusion-decision" in n: items.append(f"dec{e['ph']}@{t:.2f}")
            if n.startswith("fusion __tributary/fused") and e["ph"]=="b": items.append(f"fus_b@{t:.2f}+last{e['args']['last_member_us']/1000:.2f} decided{e['args']['decided_us']/1000:.2f}")
        out.append(h+": "+" ".join(items[:6]))
    print(it, " | ".join(out))
