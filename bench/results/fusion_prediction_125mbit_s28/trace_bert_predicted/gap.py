import json,collections,sys
h=sys.argv[1]; it=int(sys.argv[2])
ev=[]
for line in open(f"/tmp/trace-{h}.json"):
    line=line.strip().rstrip(",")
    if not line.startswith("{"): continue
    try: e=json.loads(line)
    except ValueError: continue
    if "ts" in e: ev.append(e)
bar=[e["ts"] for e in ev if e["ph"]=="e" and e["name"]=="push_pull bench.iteration-barrier"]
be=bar[it]
ev.sort(key=lambda e:e["ts"])
cnt=collections.Counter()
for e in ev:
    t=(e["ts"]-be)/1000
    if 0<=t<12:
        n=e["name"]
        key=n.split(" ")[0]+(" "+n.split(" ")[1][:12] if " " in n else "")
        if n.startswith(("credit","push s","wait for")): 
            cnt[(int(t),key,e["ph"])]+=1; continue
        print(f"{t:7.2f} {e['ph']} {n[:60]} {str(e.get('args',''))[:100]}")
for k in sorted(cnt): print(k,cnt[k])
