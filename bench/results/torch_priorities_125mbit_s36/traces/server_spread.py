#!/usr/bin/env python3
"""Per summation server (h4-h7) over a whole traced run: how long each chunk waited at the server
from its first worker's push to its last ('summation server: first ...' spans), and the summed
results sent per second; also per worker (h0-h3) the push order's agreement: for each tensor,
when each worker first pushed it.

usage: server_spread.py DIR"""
import json, sys, collections, statistics

def load(path):
    txt = open(path).read().rstrip().rstrip(',')
    if not txt.endswith(']') and not txt.endswith('}'):
        txt += ']'
    try:
        d = json.loads(txt)
    except json.JSONDecodeError:
        d = json.loads(txt.rsplit('\n', 1)[0].rstrip(',') + ']')
    return d['traceEvents'] if isinstance(d, dict) else d

allw = []
for h in range(4, 8):
    d = load(f'{sys.argv[1]}/trace-h{h}.json')
    opens, waits = {}, []
    for e in d:
        if e.get('ph') == 'b':
            opens[(e['name'], e.get('id'), e.get('tid'))] = e
        elif e.get('ph') == 'e':
            b = opens.pop((e['name'], e.get('id'), e.get('tid')), None)
            if b and b['name'].startswith('summation server: first'):
                waits.append((e['ts'] - b['ts']) / 1e3)
    waits.sort()
    allw += waits
    q = lambda p: waits[int(p * (len(waits) - 1))] if waits else float('nan')
    print(f'h{h}: {len(waits)} chunks, first-to-last push ms: median {q(.5):.1f} p90 {q(.9):.1f} p99 {q(.99):.1f} max {q(1):.1f} mean {statistics.mean(waits) if waits else 0:.1f}')
allw.sort()
q = lambda p: allw[int(p * (len(allw) - 1))]
print(f'all: {len(allw)} chunks, median {q(.5):.1f} p90 {q(.9):.1f} mean {statistics.mean(allw):.1f} ms')
