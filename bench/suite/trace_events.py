"""Reads one agent's Chrome trace (run.py --agent-arg=--trace --agent-arg=DIR/trace-{node}.json)
and the ends of its iterations' barriers: for the analysis scripts kept with results
(bench/results/*/trace_*/), which add this folder to sys.path. DIR: TRACE_DIR, default /tmp."""
import json
import os
import sys

TRACE_DIR = os.environ.get("TRACE_DIR", "/tmp")


def load(host):
    """Every event with a timestamp of host's trace, in file order."""
    events = []
    for line in open(os.path.join(TRACE_DIR, f"trace-{host}.json")):
        line = line.strip().rstrip(",")
        if not line.startswith("{"):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if "ts" in e:
            events.append(e)
    return events


def barriers(events):
    """The end of each iteration's barrier (the bench's push_pull bench.iteration-barrier)."""
    return [e["ts"] for e in events
            if e["ph"] == "e" and e["name"] == "push_pull bench.iteration-barrier"]


def window(events, bars, i):
    """The events of iteration i: from its barrier's end to the next one's."""
    end = bars[i + 1] if i + 1 < len(bars) else 1e30
    return [e for e in events if bars[i] <= e["ts"] < end]


if __name__ == "__main__":
    sys.exit("a module for the analysis scripts under bench/results/")
