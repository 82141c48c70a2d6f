"""perf script output (argv[1]) -> the malloc family's share of the samples, by thread and by
the first two tributary frames above it."""
import collections, os, re, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_stacks import load
stacks = load(sys.argv[1])
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
