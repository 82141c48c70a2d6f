"""Iterations 4-6: when each worker left the bench's barrier, and the summation server's sums and
result sends of the barrier tensor around it (ms after the earliest barrier end)."""
import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load
evs = {h: load(h) for h in ["h0","h1","h2","h3","h4","h5","h6","h7"]}
bars = {h: barriers(evs[h]) for h in ["h0","h1","h2","h3"]}
for it in [4,5,6]:
    t0 = min(bars[h][it] for h in bars)
    print("iteration", it, {h: round((bars[h][it]-t0)/1000,2) for h in bars})
    for h, ev in evs.items():
        for e in ev:
            t = (e["ts"] - t0)/1000
            if -6 < t < 4 and (e["name"].startswith(("result to", "summation server")) or e["name"] == "sum" or "barrier" in e["name"]):
                print("  ", h, round(t,2), e["ph"], e["name"], e.get("args", {}), round(e.get("dur",0)/1000,2))
