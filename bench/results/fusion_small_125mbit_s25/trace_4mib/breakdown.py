import json,sys
d=sys.argv[1]
for h in ['h0','h1','h2','h3']:
    ev=[]
    for line in open(f'{d}/{h}.json'):
        line=line.strip().rstrip(',')
        if not line.startswith('{'): continue
        try: e=json.loads(line)
        except: continue
        if 'ts' in e: ev.append(e)
    bar=[e['ts'] for e in ev if e['ph']=='e' and 'barrier' in e['name']]
    out=[]
    for i,be in enumerate(bar[2:],2):
        nxt = bar[i+1] if i+1<len(bar) else 1e30
        inwin=[e for e in ev if be<=e['ts']<nxt]
        def first(pred):
            x=[e for e in inwin if pred(e)]
            return x[0] if x else None
        fu=first(lambda e:e['ph']=='b' and e['name'].startswith('fusion '))
        de=first(lambda e:e['ph']=='b' and 'fusion-decision' in e['name'])
        dee=first(lambda e:e['ph']=='e' and 'fusion-decision' in e['name'])
        ring=first(lambda e:e['ph']=='e' and e['name'].startswith('ring __tributary/fused'))
        r=lambda t: round((t-be)/1000,1) if t else None
        if fu:
            a=fu['args']; s=fu['ts']
            out.append(dict(first_member=r(s), decided=r(s+a['decided_us']), last_member=r(s+a['last_member_us']), dec_bcast=(r(de['ts']) if de else None, r(dee['ts']) if dee else None), ring_end=r(ring['ts']) if ring else None))
    print(h)
    for o in out[:5]: print('  ',o)
