"""Per summation server (spare hosts h4-h7), over the whole run: how long each chunk's sum waited
from the first worker's push to the last one's, and which worker rank was last how often."""
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import load

for h in ["h4", "h5", "h6", "h7"]:
    begun, spans, last = {}, [], collections.Counter()
    for e in load(h):
        if not e["name"].startswith("summation server"):
            continue
        k = (e["name"], e.get("id"))
        if e["ph"] == "b":
            begun[k] = (e["ts"], e.get("args", {}).get("last_rank"))
        elif k in begun:
            t0, rank = begun.pop(k)
            spans.append((e["ts"] - t0) / 1000)
            last[rank] += 1
    print(h, "first to last push", len(spans), "median %.2f mean %.2f p90 %.2f ms" % (
        statistics.median(spans), statistics.mean(spans), sorted(spans)[int(len(spans) * .9)]),
        "last rank counts", dict(last))
