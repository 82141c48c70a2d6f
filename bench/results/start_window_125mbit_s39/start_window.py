"""CPU per process in each iteration's start window, from a suite run's traces and a system-wide
perf profile on CLOCK_MONOTONIC (session 39, BENCHMARKS.md). The start window runs from the first
process's exit from the iteration's barrier to the last node's start of the fused collective;
the end window from the first node's end of it to the last process's result.

  run.py ... --agent-arg=--trace --agent-arg=DIR/agent-{node}.json \
      --bench-rank-arg=--trace --bench-rank-arg=DIR/rank-{pid}.json --bench-rank-arg=--no-trace-tensors &
  perf record -a -k CLOCK_MONOTONIC -F 4000 -o perf.data -- sleep 6
  perf script -i perf.data -F comm,pid,tid,time,ip,sym | \
      awk '{t=$3; sub(":","",t); printf "%s %s %s ", $1,$2,t; for(i=5;i<=NF;i++) printf "%s ", $i; print ""}' > samples.txt
  python3 start_window.py DIR samples.txt [COMM whose symbols to list, default: the processes]

Each sample is 250 us of one CPU (4000 Hz). Written for session 39's runs: 4 worker nodes
without spares (the first 4 agent traces, each node's fused collective a ring span), 2 CPUs.
"""
import json,glob,collections,bisect,sys
TRACE=sys.argv[1]; SAMPLES=sys.argv[2]
def load(f):
    d=json.load(open(f)); return d['traceEvents'] if isinstance(d,dict) else d
ranks=[]
pid2name={}
for f in sorted(glob.glob(TRACE+'/rank-*.json')):
    ev=load(f)
    its=sorted([e for e in ev if e.get('ph')=='X' and 'iteration' in e['name']],key=lambda e:e['ts'])
    subs=sorted([e for e in ev if e.get('ph')=='X' and e['name']=='submissions'],key=lambda e:e['ts'])
    ranks.append((its,subs))
    pid2name[f.split('-')[-1][:-5]]='rank%d'%(len(ranks)-1)
rings=[]
for f in sorted(glob.glob(TRACE+'/agent-*.json')):
    ev=load(f); spans={}; out=[]
    for e in ev:
        if e.get('ph')=='b': spans[(e['name'],e['id'])]=e
        elif e.get('ph')=='e':
            b=spans.pop((e['name'],e['id']),None)
            if b and e['name'].startswith('ring __tributary/fused'): out.append((b['ts'],e['ts']))
    rings.append(sorted(out))
samples=[]
for line in open(SAMPLES):
    p=line.split()
    try:
        t=float(p[2].rstrip(':'))*1e6
    except: continue
    comm=p[0]; pid=p[1].split('/')[0]
    sym=' '.join(p[3:])
    samples.append((t,comm,pid,sym))
samples.sort(); ts=[s[0] for s in samples]
def windows():
    """(iteration, start window, end window, sample index ranges) for every iteration that the
    profile covers: start = first process's barrier exit .. last node's fused-ring start, end =
    first node's fused-ring end .. last process's result."""
    for k in range(len(ranks[0][0])):
        t0=min(r[0][k]['ts'] for r in ranks)
        rs=[]
        for h in range(4):
            c=[x for x in rings[h] if x[0]>=t0-3000 and x[0]<t0+60000]
            if c: rs.append(c[0])
        if len(rs)<4: continue
        t1=max(x[0] for x in rs)
        if t0<ts[0] or t1>ts[-1]: continue
        e0=min(x[1] for x in rs); e1=max(r[0][k]['ts']+r[0][k]['dur'] for r in ranks)
        yield ((t0,t1),(e0,e1),(bisect.bisect_left(ts,t0),bisect.bisect_left(ts,t1)),
               (bisect.bisect_left(ts,e0),bisect.bisect_left(ts,e1)))
def who(s):
    return s[1] if s[1]!='tributary' else pid2name.get(s[2],'rank?')
tot=collections.Counter(); nwin=0; dur=0
ends=collections.Counter(); nend=0; dure=0
for (t0,t1),(e0,e1),(i,j),(ei,ej) in windows():
    nwin+=1; dur+=t1-t0
    for s in samples[i:j]: tot[who(s)]+=1
    nend+=1; dure+=e1-e0
    for s in samples[ei:ej]: ends[who(s)]+=1
# 4000 Hz per CPU: each sample = 250us of one CPU
if nwin == 0 or nend == 0:
    sys.exit('no iteration of the traces falls within the profile (was perf run with -k CLOCK_MONOTONIC?)')
print('start windows',nwin,'mean dur %.2f ms'%(dur/nwin/1000),'capacity %.2f core-ms'%(2*dur/nwin/1000))
for k,n in tot.most_common(15): print('  %-18s %.3f core-ms per window'%(k,n*0.25/nwin))
print('end windows',nend,'mean dur %.2f ms'%(dure/nend/1000))
for k,n in ends.most_common(15): print('  %-18s %.3f core-ms per window'%(k,n*0.25/nend))
WHO=sys.argv[3] if len(sys.argv)>3 else "tributary"
print('---', WHO, 'symbols in the start windows')
sym=collections.Counter()
for _,_,(i,j),_ in windows():
    for s in samples[i:j]:
        if s[1]==WHO: sym[s[3][:90]]+=1
for k,n in sym.most_common(25): print('  %.3f  %s'%(n*0.25/nwin,k))
