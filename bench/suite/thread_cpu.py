#!/usr/bin/env python3
"""CPU time and context switches per thread of an emulated cluster's processes, over a window.

Run it beside a suite run (bench/suite/run.py) once the timed iterations have started:

    bench/suite/thread_cpu.py --seconds 20 --workers 4

Every thread of every process in a host's network namespace (scripts/emulated_cluster.sh,
trib-hK) is sampled at the start and the end of the window (and once a second in between, so
that threads which start or end inside it count from their first to their last sample). Threads
are grouped by role (worker hosts hK with K < --workers, spare hosts the rest), process name and
thread name (the agent names its threads: trib-tcp is the data plane's progress thread, trib-ring
the control ring's, see common/thread_name.h), and the figures are per host of that role, per
second: CPU in ms (utime + stime from /proc/PID/task/TID/stat, in clock ticks) and voluntary /
involuntary context switches. Divide by the iterations per second for figures per iteration.

CPU time here is what the kernel charged to each thread: on the emulated cluster that includes
network softirqs (the bridge, tbf and the receiving host's TCP stack) that ran while the thread
was on a CPU, which a real host would not pay (BENCHMARKS.md, session 44).
"""

import argparse
import collections
import os
import re
import sys
import time

from run import host_processes

NS_PREFIX = "trib-h"  # scripts/emulated_cluster.sh: TRIB_EMU_NAME (default trib) + "-h"


def namespaces(prefix):
    """{(st_dev, st_ino) of /run/netns/<prefix>K: K}."""
    out = {}
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return out
    for name in names:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
        if not m:
            continue
        try:
            st = os.stat(f"/run/netns/{name}")
        except OSError:
            continue
        out[(st.st_dev, st.st_ino)] = int(m.group(1))
    return out


def read_thread(pid, tid):
    """(thread name, cpu ticks, voluntary, involuntary) or None if it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            status = f.read()
    except OSError:
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    vol = int(re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M).group(1))
    invol = int(re.search(r"^nonvoluntary_ctxt_switches:\s*(\d+)", status, re.M).group(1))
    return name, ticks, vol, invol


def sample(hosts):
    """{(host, pid, tid, process name): (thread name, ticks, vol, invol)}."""
    out = {}
    for host, pid in host_processes(hosts):
        try:
            with open(f"/proc/{pid}/comm") as f:
                process = f.read().strip()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            got = read_thread(pid, tid)
            if got:
                out[(host, pid, tid, process)] = got
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20, help="the window (default 20)")
    ap.add_argument("--workers", type=int, default=4,
                    help="hosts h0..h(N-1) are workers, the rest spares (default 4)")
    ap.add_argument("--prefix", default=NS_PREFIX,
                    help=f"namespace name prefix (default {NS_PREFIX})")
    args = ap.parse_args()
    if args.seconds <= 0:
        sys.exit("thread_cpu: --seconds must be positive")
    hosts = namespaces(args.prefix)
    if not hosts:
        sys.exit(f"thread_cpu: no namespaces /run/netns/{args.prefix}K: is a cluster up (root)?")
    first, last = {}, {}
    start = time.monotonic()
    while True:
        now = time.monotonic()
        for key, value in sample(hosts).items():
            if key not in first:
                first[key] = value
            last[key] = value
        if now - start >= args.seconds:
            break
        time.sleep(min(1.0, args.seconds - (now - start)))
    wall = time.monotonic() - start
    tick = os.sysconf("SC_CLK_TCK")
    per_role = collections.Counter(
        "worker" if h < args.workers else "spare" for h in set(hosts.values()))
    groups = collections.defaultdict(lambda: [0, 0, 0, set()])
    for key, (name, ticks, vol, invol) in last.items():
        host, _, _, process = key
        _, ticks0, vol0, invol0 = first[key]
        role = "worker" if host < args.workers else "spare"
        g = groups[(role, process, name)]
        g[0] += ticks - ticks0
        g[1] += vol - vol0
        g[2] += invol - invol0
        g[3].add(key[1:3])
    print(f"# {wall:.1f} s window; per host of the role, per second "
          f"({per_role['worker']} worker, {per_role['spare']} spare hosts)")
    print("| role | process | thread | threads | CPU ms/s | voluntary switches/s | "
          "involuntary switches/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    rows = sorted(groups.items(), key=lambda kv: (kv[0][0] != "worker", -kv[1][0], -kv[1][1]))
    for (role, process, name), (ticks, vol, invol, threads) in rows:
        n = max(1, per_role[role])
        if ticks == 0 and vol + invol == 0:
            continue
        print(f"| {role} | {process} | {name} | {len(threads) / n:.1f} | "
              f"{1000.0 * ticks / tick / wall / n:.1f} | {vol / wall / n:.0f} | "
              f"{invol / wall / n:.0f} |")


if __name__ == "__main__":
    main()
