import collections, sys, re
stacks=[]; cur=[]
for line in open(sys.argv[1]):
    line=line.rstrip('\n')
    if not line.strip():
        if cur: stacks.append(cur); cur=[]
        continue
    if not line.startswith('\t') and not line.startswith(' '):
        cur=[line]; continue
    parts=line.strip().split(' ',1)
    cur.append(parts[1] if len(parts)>1 else parts[0])
if cur: stacks.append(cur)
total=len(stacks)
M=('malloc','_int_malloc','_int_free','cfree','free','malloc_consolidate','unlink_chunk','operator new','operator delete','tcache','__libc_free','__GI___libc_malloc','_int_realloc','realloc')
def ismalloc(f): return any(f.startswith(m) for m in M)
def short(f):
    for _ in range(5): f=re.sub(r'<[^<>]*>','',f)
    f=re.sub(r'\(.*','',f).replace('tributary::','').replace('std::','').replace(' (inlined)','')
    return f[-80:]
thr=collections.Counter(); c=collections.Counter(); n=0
for s in stacks:
    frames=s[1:]
    if not frames or not ismalloc(frames[0]): continue
    n+=1
    top='ring' if any('ControlRings::Host::Run' in f for f in frames) else ('transport' if any('TcpTransport' in f for f in frames) else 'other')
    thr[top]+=1
    owner=[short(f) for f in frames if 'tributary::' in f and 'inlined' not in f][:2]
    c[top+': '+' < '.join(owner)]+=1
print(f"malloc family: {n/total*100:.1f}% of {total} samples; by thread", {k: f"{v/total*100:.1f}%" for k,v in thr.items()})
for k,v in c.most_common(25): print(f"  {v/total*100:5.2f}%  {k}")
