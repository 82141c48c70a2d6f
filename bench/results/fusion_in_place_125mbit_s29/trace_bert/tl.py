"""Per timed iteration, per worker (ms after the earliest barrier end): its barrier end, its fused
collective's members' arrival (first-last), the decision broadcast's end, its first push; and each
process's submissions (bench-rank --trace, rank-<pid>.json in TRACE_DIR)."""
import os
import sys, json, glob
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load, window
evs = {h: load(h) for h in ["h0","h1","h2","h3"]}
bars = {h: barriers(evs[h]) for h in evs}
# process side
ranks = []
for f in sorted(glob.glob(os.path.join(os.environ.get("TRACE_DIR", "/tmp"), "rank-*.json"))):
    d = json.load(open(f)); d = d["traceEvents"] if isinstance(d, dict) else d
    ranks.append(sorted([e for e in d if e.get("name") == "submissions"], key=lambda e: e["ts"]))
for it in range(2, 10):
    t0 = min(bars[h][it] for h in evs)
    row = []
    for h in evs:
        fp = None; dec = None; fus = None
        for e in window(evs[h], bars[h], it):
            t = (e["ts"] - t0) / 1000
            n = e["name"]
            if n.startswith("push s") and e["ph"] == "b" and e.get("args", {}).get("bytes", 0) > 100:
                fp = t if fp is None else min(fp, t)
            if n == "control __tributary/fusion-decision" and e["ph"] == "e" and dec is None: dec = t
            if n.startswith("fusion __tributary/fused") and e["ph"] == "b" and fus is None: fus = (t, e["args"]["last_member_us"]/1000)
        row.append(f"{h}: bar {(bars[h][it]-t0)/1000:3.1f} mem {fus[0]:3.1f}-{fus[0]+fus[1]:3.1f} dec {dec if dec is None else round(dec,1)} push {fp:3.1f}")
    subs = []
    for r in ranks:
        c = [s for s in r if t0 - 2000 <= s["ts"] <= t0 + 20000]
        if c: subs.append(f"{(c[0]['ts']-t0)/1000:.1f}+{c[0]['dur']/1000:.1f}")
    print(it, " | ".join(row), "| procs", subs)
