import json,collections,statistics
for h in ["h4","h5","h6","h7"]:
    ev=[]
    for line in open(f"/tmp/trace-{h}.json"):
        line=line.strip().rstrip(",")
        if not line.startswith("{"): continue
        try: e=json.loads(line)
        except ValueError: continue
        if "ts" in e: ev.append(e)
    names=collections.Counter(e["name"].split(" ")[0]+" "+(e["name"].split(" ")[1] if " " in e["name"] else "") for e in ev)
    opens={}; durs=collections.defaultdict(list); last=collections.Counter()
    for e in ev:
        n=e["name"]
        if n.startswith("summation server"):
            k=(n,e.get("id"))
            if e["ph"]=="b": opens[k]=(e["ts"],e.get("args",{}).get("last_rank"))
            elif k in opens:
                t0,lr=opens.pop(k); durs[n].append((e["ts"]-t0)/1000); last[lr]+=1
    for n,l in durs.items():
        print(h,n,len(l),"median %.2f mean %.2f p90 %.2f"%(statistics.median(l),statistics.mean(l),sorted(l)[int(len(l)*.9)]), "last rank counts",dict(last))
    print(h, names.most_common(8))
