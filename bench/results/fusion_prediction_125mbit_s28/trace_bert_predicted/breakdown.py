"""Reads the agents' traces (--agent-arg=--trace --agent-arg=/tmp/trace-{node}.json) of a
bert-large-1d run and prints, for timed iterations 3-7 on each worker node, in ms after the
iteration's barrier: each fused group (first member, decided_us and last_member_us after it,
bytes), each fused push/pull collective's begin and end (with its chunk count), and the fusion
decision broadcasts ('control')."""
import json
import sys

d = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
for h in ["h0", "h1", "h2", "h3"]:
    ev = []
    for line in open(f"{d}/trace-{h}.json"):
        line = line.strip().rstrip(",")
        if not line.startswith("{"):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if "ts" in e:
            ev.append(e)
    bar = [e["ts"] for e in ev if e["ph"] == "e" and e["name"] == "push_pull bench.iteration-barrier"]
    print(h)
    for i, be in enumerate(bar[3:8], 3):
        nxt = bar[i + 1] if i + 1 < len(bar) else 1e30
        win = [e for e in ev if be <= e["ts"] < nxt]
        r = lambda t: round((t - be) / 1000, 1)
        out = []
        for e in win:
            n = e["name"]
            if n.startswith("fusion ") and e["ph"] == "b":
                a = e["args"]
                out.append(("fusion", r(e["ts"]), a.get("decided_us"), a.get("last_member_us"),
                            a.get("bytes")))
            elif n.startswith("push/pull __tributary/fused"):
                out.append(("push/pull", e["ph"], r(e["ts"]), e.get("args", {}).get("chunks")))
            elif n.startswith("control"):
                out.append(("decision broadcast", e["ph"], r(e["ts"])))
        print("  ", out)
