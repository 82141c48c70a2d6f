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
for h in ["h0","h2"]:
    ev=load(h)
    bar=[e["ts"] for e in ev if e["ph"]=="e" and e["name"]=="push_pull bench.iteration-barrier"]
    i=5; be,nx=bar[i],bar[i+1]
    win=[e for e in ev if be<=e["ts"]<nx]
    opens={}
    spans=collections.defaultdict(list)
    for e in win:
        n=e["name"]
        if any(n.startswith(p) for p in ("credit wait s4","push s4","wait for sum s4")):
            k=(n,e["id"],e.get("args",{}).get("chunk"))
            if e["ph"]=="b": opens[(n,e["id"])]=(e["ts"]-be)/1000
            elif (n,e["id"]) in opens: spans[n].append((opens.pop((n,e["id"])),(e["ts"]-be)/1000))
    for n,l in spans.items():
        l.sort()
        print(h,n,len(l),"first",l[:3],"last",l[-3:], "mean dur %.2f"%(sum(b-a for a,b in l)/len(l)))
