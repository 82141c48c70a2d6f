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
for fn in sys.argv[2:]:
    n=sum(1 for s in stacks if any(fn in f for f in s[1:]))
    print(f"{n/total*100:5.1f}%  {fn}")
