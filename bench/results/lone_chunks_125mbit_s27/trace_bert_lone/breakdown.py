"""Reads the agents' traces (--agent-arg=--trace --agent-arg=/tmp/trace-{node}.json) of a
bert-large-1d run and prints, for timed iterations 3-7 on each worker node, in ms after the
iteration's barrier: each fused group (first member, decided_us and last_member_us after it,
bytes), each fused push/pull collective's begin and end (with its chunk count), and the fusion
decision broadcasts ('control')."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
os.environ.setdefault("TRACE_DIR", sys.argv[1] if len(sys.argv) > 1 else "/tmp")
from trace_events import barriers, load, window  # noqa: E402

for h in ["h0", "h1", "h2", "h3"]:
    ev = load(h)
    bar = barriers(ev)
    print(h)
    for i in range(3, 8):
        r = lambda t, i=i: round((t - bar[i]) / 1000, 1)
        out = []
        for e in window(ev, bar, i):
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
