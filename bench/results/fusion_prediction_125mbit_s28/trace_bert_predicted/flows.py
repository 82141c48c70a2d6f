import json,collections
def load(h):
    ev=[]
    for line in open(f"/tmp/trace-{h}.json"):
        line=line.strip().rstrip(",")
        if not line.startswith("{"): continue
        try: e=json.loads(line)
        except ValueError: continue
        if "ts" in e: ev.append(e)
    return ev
for h in ["h0","h1","h2","h3"]:
    ev=load(h)
    bar=[e["ts"] for e in ev if e["ph"]=="e" and e["name"]=="push_pull bench.iteration-barrier"]
    for i in range(4,7):
        be,nx=bar[i],bar[i+1]
        win=[e for e in ev if be<=e["ts"]<nx]
        last_push=collections.defaultdict(float); first_push={}; last_sum=collections.defaultdict(float); nbytes=collections.defaultdict(int)
        open_b={}
        for e in win:
            n=e["name"]
            if n.startswith("push s"):
                s=n[5:]
                if e["ph"]=="b":
                    first_push.setdefault(s,(e["ts"]-be)/1000); nbytes[s]+=e["args"]["bytes"]
                else: last_push[s]=max(last_push[s],(e["ts"]-be)/1000)
            if n.startswith("wait for sum s") and e["ph"]=="e":
                s=n[13:]; last_sum[s]=max(last_sum[s],(e["ts"]-be)/1000)
        print(h,i," ".join(f"{s}: push {first_push.get(s,0):.0f}-{last_push[s]:.0f} sum<= {last_sum[s]:.0f} {nbytes[s]//1024}K" for s in sorted(last_push)))
