"""Per timed iteration (argv: the fused collective's algorithm, ring or push_pull), in ms after
rank 0's process left the barrier: each process's submissions (start+duration), each worker
agent's launch of the fused collective and its end; the decision broadcasts; the fusion spans
(first member / last member / decided / span end); rank 0's iteration end against h0's fused end;
and when the last worker would have launched had every follower launched at its own last member.
Traces from run.py --agent-arg=--trace --agent-arg=$TRACE_DIR/trace-{node}.json
--bench-rank-arg=--trace --bench-rank-arg=$TRACE_DIR/rank-{pid}.json (ranks in pid order)."""
import os, sys, json, glob
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../suite"))
from trace_events import load, TRACE_DIR
op=sys.argv[1] if len(sys.argv)>1 else 'ring'
H=['h0','h1','h2','h3']
ev={h:load(h) for h in H}
ranks=[]
for f in sorted(glob.glob(os.path.join(TRACE_DIR, 'rank-*.json')), key=lambda f:int(f.split('-')[1].split('.')[0])):
    d=json.load(open(f)); d=d['traceEvents'] if isinstance(d,dict) else d
    ranks.append(sorted([(e['ts'], e['dur']) for e in d if e.get('name')=='submissions']))
def spans(h, prefix):
    b={}; out=[]
    for e in ev[h]:
        if e['name'].startswith(prefix):
            if e['ph']=='b': b[e['name']]=e['ts']
            elif e['ph']=='e' and e['name'] in b: out.append((b.pop(e['name']), e['ts']))
    return sorted(out)
fused={h:spans(h, op+' __tributary/fused/') for h in H}
n=min(len(r) for r in ranks)
for it in range(3, n):
    t0=ranks[0][it][0]
    nxt=ranks[0][it+1][0] if it+1<n else 1e30
    row=[]
    for i,h in enumerate(H):
        s,d=ranks[i][it]
        fs=[(b,e) for b,e in fused[h] if t0-20000 < b < nxt-20000]
        L=f"{(min(b for b,_ in fs)-t0)/1e3:.1f}" if fs else "-"
        E=f"{(max(e for _,e in fs)-t0)/1e3:.1f}" if fs else "-"
        row.append(f"{h}: sub {(s-t0)/1e3:+.1f}+{d/1e3:.1f} launch {L} end {E}")
    print(it, " | ".join(row))
print("decision: leader begin / followers' receive / launch (ms after rank 0 start)")
dec={h:spans(h, 'control __tributary/fusion-decision') for h in H}
for it in range(3, n):
    t0=ranks[0][it][0]; nxt=ranks[0][it+1][0] if it+1<n else 1e30
    row=[]
    for h in H:
        ds=[(b,e) for b,e in dec[h] if t0-20000 < e < nxt-20000]
        fs=[(b,e) for b,e in fused[h] if t0-20000 < b < nxt-20000]
        row.append(f"{h}: " + ",".join(f"{(b-t0)/1e3:.1f}/{(e-t0)/1e3:.1f}" for b,e in ds) + f" L{(min(b for b,_ in fs)-t0)/1e3:.1f}")
    print(it, " | ".join(row))
print("fusion span: first member / last member / decided / span end / launch")
fz={}
for h in H:
    b={}; out=[]
    for e in ev[h]:
        if e['name'].startswith('fusion __tributary/fused/'):
            if e['ph']=='b': b[e['name']]=(e['ts'], e.get('args',{}))
            elif e['ph']=='e' and e['name'] in b:
                ts,a=b.pop(e['name']); out.append((ts, ts+a.get('last_member_us',0), ts+a.get('decided_us',0), e['ts']))
    fz[h]=sorted(out)
for it in range(3, n):
    t0=ranks[0][it][0]; nxt=ranks[0][it+1][0] if it+1<n else 1e30
    row=[]
    for h in H:
        zs=[z for z in fz[h] if t0-20000 < z[0] < nxt-20000]
        fs=[(b,e) for b,e in fused[h] if t0-20000 < b < nxt-20000]
        row.append(f"{h}: " + ",".join("/".join(f"{(x-t0)/1e3:.1f}" for x in z) for z in zs) + f" L{(min(b for b,_ in fs)-t0)/1e3:.1f}")
    print(it, " | ".join(row))
print("rank0 iteration end vs h0 fused end")
d=json.load(open(sorted(glob.glob(os.path.join(TRACE_DIR, 'rank-*.json')), key=lambda f:int(f.split('-')[1].split('.')[0]))[0])); d=d['traceEvents'] if isinstance(d,dict) else d
its=sorted([(e['ts'], e['dur']) for e in d if e.get('name','').startswith('bert-large-1d iteration')])
for it in range(3, n):
    t0=ranks[0][it][0]
    te=[s+du for s,du in its if abs(s-t0)<5000]
    fs=[e for b,e in fused['h0'] if t0-20000 < b < t0+20000]
    print(it, "iter end", f"{(te[0]-t0)/1e3:.2f}" if te else '-', "fused end", f"{(max(fs)-t0)/1e3:.2f}" if fs else '-')
print("standing-decision estimate: max launch vs max(own last member; leader's own launch)")
sav=[]
for it in range(3, n):
    t0=ranks[0][it][0]; nxt=ranks[0][it+1][0] if it+1<n else 1e30
    L=[]; M=[]
    for h in H:
        zs=[z for z in fz[h] if t0-20000 < z[0] < nxt-20000]
        fs=[(b,e) for b,e in fused[h] if t0-20000 < b < nxt-20000]
        L.append(min(b for b,_ in fs)); M.append(min(b for b,_ in fs) if h=='h0' else max(z[1] for z in zs[:1]))
    sav.append((max(L)-max(M))/1e3); print(it, f"{(max(L)-t0)/1e3:.1f} -> {(max(M)-t0)/1e3:.1f}")
print("savings", [round(x,1) for x in sav], "mean", round(sum(sav)/len(sav),2))
