#!/usr/bin/env python3
"""Merges Chrome traces (common/trace.h: the agents' --trace, bench-rank's --trace) into one file.

The processes of one machine share the monotonic clock that timestamps their events, so the
merged timeline lines up: open the output in chrome://tracing or https://ui.perfetto.dev.
A trace whose process was killed has no closing bracket; it is read all the same.

    scripts/merge_traces.py -o all.json /tmp/emu/trace-*.json /tmp/rank0.json
"""
import argparse
import json
import sys


def load(path):
    text = open(path).read().rstrip()
    if text.endswith(","):
        text = text[:-1]
    if text.startswith("[") and not text.endswith("]"):
        text += "]"
    events = json.loads(text)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    merged = []
    for path in args.traces:
        try:
            merged.extend(load(path))
        except (OSError, ValueError) as e:
            sys.exit(f"merge_traces: {path}: {e}")
    with open(args.output, "w") as f:
        json.dump({"traceEvents": merged, "displayTimeUnit": "ms"}, f)
    print(f"merge_traces: {len(merged)} events from {len(args.traces)} files -> {args.output}")


if __name__ == "__main__":
    main()
