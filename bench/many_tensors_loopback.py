#!/usr/bin/env python3
"""Many small tensors through the whole local path, on loopback: the agent's per-tensor cost.

A local cluster (tributary-run: controller + 2 agents, 1 process each, loopback TCP) runs
`tributary bench-rank` on a workload's gradient list (default: bert-large-1d, BERT-large's 243
biases and LayerNorm tensors, 1.29 MB), every tensor submitted at once and fused by the agents.
The data is small, so the time and CPU per iteration are the per-tensor work of the processes
and agents (submission through the control ring, the local gather, tensor fusion, completion).
CPU is every process of the run (agents, controller, bench processes) from getrusage, with a
10-iteration run subtracted so that start-up and joining cancel out. Each row is one run; runs
alternate when several --bin-dir are given (an A/B of two builds). Prints a table.

  python3 bench/many_tensors_loopback.py --bin-dir build/bin [--bin-dir other/bin] [--runs 4]
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(bin_dir, tensors, iters):
    env = dict(os.environ, UCX_NET_DEVICES="lo", UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
    rank = (f"exec {bin_dir}/tributary bench-rank --agent $TRIBUTARY_AGENT_ADDRESS "
            "--job $TRIBUTARY_JOB --local-rank $TRIBUTARY_LOCAL_RANK "
            f"--local-size $TRIBUTARY_LOCAL_SIZE --tensors {tensors} --workload-name w "
            f"--iters {iters} --warmup 5")
    cmd = [f"{bin_dir}/tributary-run", "--np", "2", "--procs-per-node", "1", "--", "sh", "-c",
           rank]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = re.search(r"([0-9.]+) us per iteration, (\d+) wrong", out.stdout)
    if out.returncode != 0 or found is None:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}"
                 f"{out.stderr[-2000:]}")
    if int(found.group(2)) != 0:
        sys.exit(f"{found.group(2)} wrong elements")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(found.group(1)), cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", action="append", help="a build's bin folder (repeatable)")
    parser.add_argument("--workload", default="bert-large-1d")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    bin_dirs = [os.path.abspath(d) for d in (args.bin_dir or [os.path.join(ROOT, "build/bin")])]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(subprocess.run([sys.executable, os.path.join(ROOT, "bench/suite/run.py"),
                                "--print-workload", args.workload], check=True,
                               capture_output=True, text=True).stdout)
        tensors = f.name
    count = sum(1 for line in open(tensors) if line.strip() and not line.startswith("#"))
    rows = {d: [] for d in bin_dirs}
    try:
        for _ in range(args.runs):
            for d in bin_dirs:
                base_us, base_cpu = run_once(d, tensors, 10)
                us, cpu = run_once(d, tensors, args.iters)
                rows[d].append((us, (cpu - base_cpu) / (args.iters - 10) * 1e3))
    finally:
        os.unlink(tensors)
    print(f"# {args.workload}: {count} tensors, 2 agents x 1 process on loopback, "
          f"{args.iters} iterations per run, {args.runs} runs per build")
    print("| build | us per iteration (runs) | median | CPU ms per iteration (runs) | median | "
          "x first build |")
    print("|---|---|---:|---|---:|---:|")
    first = None
    for d in bin_dirs:
        us = [r[0] for r in rows[d]]
        cpu = [r[1] for r in rows[d]]
        median = statistics.median(us)
        first = first or median
        print(f"| {os.path.relpath(d, ROOT)} | {' '.join(f'{x:.0f}' for x in us)} | "
              f"{median:.0f} | {' '.join(f'{x:.2f}' for x in cpu)} | "
              f"{statistics.median(cpu):.2f} | {median / first:.2f} |")


if __name__ == "__main__":
    main()
