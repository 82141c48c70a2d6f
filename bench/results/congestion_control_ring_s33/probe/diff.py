import sys,glob,re,collections
d=sys.argv[1]
for K in range(4):
    files=sorted(glob.glob(f"{d}/h{K}.*.txt"), key=lambda f:int(f.split('.')[-2]))
    files=[f for f in files if open(f).read().strip()]
    def parse(f):
        L=open(f).read().split('\n'); r={}
        for a,b in zip(L[0::2],L[1::2]):
            if not a: continue
            for n,v in zip(a.split()[1:],b.split()[1:]): r[n]=int(v)
        return r
    a,b=parse(files[0]),parse(files[-1])
    print(f"h{K}", {k:b[k]-a.get(k,0) for k in b if b[k]-a.get(k,0)!=0 and any(s in k for s in ('Zero','Retrans','Loss','Timeout','Probe','Prune','Collapse','Drop','OFO','RcvQ','Backlog','DelayedACK','Persist','Recovery','Window'))})
