"""Workers h0 and h2, timed iteration 5: the chunks for server s4 -- how long each waited for the
window ("credit wait"), was sent ("push") and waited for its sum (ms after the barrier)."""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import barriers, load, window

for h in ["h0", "h2"]:
    ev = load(h)
    bar = barriers(ev)
    begun, spans = {}, collections.defaultdict(list)
    for e in window(ev, bar, 5):
        n = e["name"]
        if n not in ("credit wait s4", "push s4", "wait for sum s4"):
            continue
        t = (e["ts"] - bar[5]) / 1000
        if e["ph"] == "b":
            begun[(n, e["id"])] = t
        elif (n, e["id"]) in begun:
            spans[n].append((begun.pop((n, e["id"])), t))
    for n, s in spans.items():
        s.sort()
        print(h, n, len(s), "first", s[:3], "last", s[-3:],
              "mean dur %.2f" % (sum(b - a for a, b in s) / len(s)))
