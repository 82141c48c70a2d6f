#!/usr/bin/env python3
"""Per worker agent (h0-h3): sums received and pushes handed to the transport, MB/s per 250 ms of
one workload iteration (from the end of its barrier), from agent traces written with
`run.py --agent-arg=--trace --agent-arg=DIR/trace-{node}.json`.

usage: link_rates_per_250ms.py DIR [ITERATION (default 1)]"""
import json,sys,collections
it=int(sys.argv[2]) if len(sys.argv)>2 else 1
B=250000
for h in range(4):
    d=json.load(open(f'{sys.argv[1]}/trace-h{h}.json'))
    if isinstance(d,dict): d=d['traceEvents']
    bars=sorted([e for e in d if e.get('ph') in('b','e') and e['name']=='push/pull bench.iteration-barrier'], key=lambda e:e['ts'])
    ends=[e['ts'] for e in bars if e['ph']=='e']; begins=[e['ts'] for e in bars if e['ph']=='b']
    t0=ends[it]; t1=begins[it+1] if it+1<len(begins) else 1e30
    opens={}
    recv=collections.Counter(); push=collections.Counter(); lastend=0
    for e in d:
        if e.get('ph')=='b': opens[(e['name'],e.get('id'),e.get('tid'))]=e
        elif e.get('ph')=='e':
            b=opens.pop((e['name'],e.get('id'),e.get('tid')),None)
            if not b or b['ts']<t0 or e['ts']>t1: continue
            bi=int((e['ts']-t0)/B)
            if b['name'].startswith('wait for sum'): recv[bi]+=b['args']['bytes']
            if b['name'].startswith('push s'): push[bi]+=b['args']['bytes']
            if b['name'].startswith('push/pull ') and 'barrier' not in b['name']: lastend=max(lastend,e['ts'])
    n=int((lastend-t0)/B)+1
    print(f'h{h} iteration {it}: {(lastend-t0)/1e3:.0f} ms; received {sum(recv.values())/1e6:.1f} MB pushed {sum(push.values())/1e6:.1f} MB')
    print(' recv MB/s:', ' '.join(f'{recv[i]/(B/1e6)/1e6:.0f}' for i in range(n)))
    print(' push MB/s:', ' '.join(f'{push[i]/(B/1e6)/1e6:.0f}' for i in range(n)))
