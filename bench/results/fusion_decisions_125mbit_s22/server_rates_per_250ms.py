#!/usr/bin/env python3
"""Per summation server (h4-h7): results sent (MB/s), median time from a chunk's first push to its
last (ms) and the sum thread's busy %, per 250 ms of one workload iteration (worker h0's
barriers delimit it), from the agents' traces (see link_rates_per_250ms.py).

usage: server_rates_per_250ms.py DIR [ITERATION (default 1)]"""
import json,sys,collections
it=int(sys.argv[2]) if len(sys.argv)>2 else 1
B=250000
d0=json.load(open(f'{sys.argv[1]}/trace-h0.json'))
if isinstance(d0,dict): d0=d0['traceEvents']
bars=sorted([e for e in d0 if e.get('ph') in('b','e') and e['name']=='push/pull bench.iteration-barrier'], key=lambda e:e['ts'])
ends=[e['ts'] for e in bars if e['ph']=='e']; begins=[e['ts'] for e in bars if e['ph']=='b']
t0=ends[it]; t1=begins[it+1] if it+1<len(begins) else t0+8e6
for h in range(4,8):
    d=json.load(open(f'{sys.argv[1]}/trace-h{h}.json'))
    if isinstance(d,dict): d=d['traceEvents']
    opens={}; res=collections.Counter(); spread=collections.defaultdict(list); sums=collections.Counter()
    for e in d:
        if e.get('ph')=='X' and e['name']=='sum' and t0<=e['ts']<=t1: sums[int((e['ts']-t0)/B)]+=e['dur']
        if e.get('ph')=='b': opens[(e['name'],e.get('id'),e.get('tid'))]=e
        elif e.get('ph')=='e':
            b=opens.pop((e['name'],e.get('id'),e.get('tid')),None)
            if not b or b['ts']<t0 or e['ts']>t1: continue
            bi=int((e['ts']-t0)/B)
            if b['name'].startswith('result to'): res[bi]+=b['args']['bytes']
            if b['name'].startswith('summation server: first'): spread[bi].append((e['ts']-b['ts'])/1e3)
    n=int((t1-t0)/B)+1
    print(f'h{h}: results sent MB/s:', ' '.join(f'{res[i]/(B/1e6)/1e6:.0f}' for i in range(n)))
    print(f'    first-to-last push median ms:', ' '.join(f'{sorted(spread[i])[len(spread[i])//2]:.0f}' if spread[i] else '-' for i in range(n)))
    print(f'    sum thread busy %:', ' '.join(f'{sums[i]/B*100:.0f}' for i in range(n)))
