#!/usr/bin/env python3
"""When each worker agent (h0-h3) started each of the agent's own collectives (fused collectives,
fusion list and decision broadcasts), in ms from the end of its first workload barrier, from the
agents' traces (see link_rates_per_250ms.py). Worker h0 is the fusion leader.

usage: fused_starts.py DIR"""
import json
import sys

for h in range(4):
    d = json.load(open(f'{sys.argv[1]}/trace-h{h}.json'))
    if isinstance(d, dict):
        d = d['traceEvents']
    bars = sorted(e['ts'] for e in d
                  if e.get('ph') == 'e' and e['name'] == 'push/pull bench.iteration-barrier')
    t0 = bars[0]
    own = sorted((e['ts'], e['name'].split(' ')[-1].split('/')[-1], e['args']['bytes'])
                 for e in d if e.get('ph') == 'b' and '__tributary/' in e['name'])
    print(f'h{h}: barriers at', [int((b - t0) / 1e3) for b in bars], 'ms')
    print('   (start ms, fused k or list/decision broadcast, bytes):',
          [(int((t - t0) / 1e3), n, b) for t, n, b in own])
