#!/usr/bin/env python3
"""Every 5 s: each tributary-agent's voluntary context switches per second and CPU % (all threads),
labelled by its --node-id. Runs until killed."""
import os, time, re, sys
HZ = os.sysconf("SC_CLK_TCK")
def agents():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError: continue
        if not cmd or not cmd[0].endswith(b"tributary-agent"): continue
        node = "?"
        for i, a in enumerate(cmd):
            if a in (b"--node-id",) and i + 1 < len(cmd): node = cmd[i+1].decode()
            elif a.startswith(b"--node-id="): node = a.split(b"=",1)[1].decode()
        out[int(pid)] = node
    return out
def sample(pid):
    sw = cpu = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            st = open(f"/proc/{pid}/task/{t}/status").read()
            sw += int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", st).group(1))
            f = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
            cpu += int(f[11]) + int(f[12])
    except (OSError, AttributeError): return None
    return sw, cpu
prev = {}
while True:
    now = time.time(); cur = {}
    for pid, node in agents().items():
        s = sample(pid)
        if s: cur[pid] = (node, s)
    for pid, (node, (sw, cpu)) in sorted(cur.items(), key=lambda x: x[1][0]):
        if pid in prev:
            dt = now - prev[pid][0]; psw, pcpu = prev[pid][1]
            print(f"{now:.0f} {node} {pid} {(sw-psw)/dt:.0f}/s {100*(cpu-pcpu)/HZ/dt:.1f}%", flush=True)
    prev = {pid: (now, s) for pid, (node, s) in cur.items()}
    time.sleep(5)
