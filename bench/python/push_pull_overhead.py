#!/usr/bin/env python3
"""Python overhead of tributary.torch.push_pull against the C++ client, on one local cluster.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/push_pull_overhead.py --bin-dir build/bin

starts one local cluster (`tributary local-cluster`: 2 worker agents + 2 spares on loopback, no
NIC pacing) and runs two jobs on it with `tributary-run --controller ... --np 4
--procs-per-node 2`: the C++ client's sweep (`tributary bench-rank`, sum, float32), and this
script as every rank, timing per size `push_pull(average=False)` on (a) an ordinary tensor
(staged: one copy into a pooled shared buffer and one back) and (b) a tensor from
`tributary.torch.empty` (zero copy). Time per operation = mean over --iters after --warmup, as
bench-rank measures it (submit to completion, each rank on its own, inputs refilled outside the
timed region); rounds alternate which side runs first; each round is printed, and the table
shows each side's best round (the machine's load moves single rounds by tens of percent).
Untimed work between iterations is the same on both sides: one pass refilling the input (the
ranks are not synchronised per iteration, so a slow refill or check on one rank shows up in the
others' times); bench-rank runs with --no-check and the Python side checks every element of
the last iteration's result.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def rank_main(args):
    import torch
    import tributary.torch as trt

    sizes = [parse_size(x) for x in args.sizes.split(",")]
    trt.init()
    world = trt.size()
    for size in sizes:
        n = size // 4
        base = (torch.arange(n, dtype=torch.float32) % 7 + 1)
        values = base * (trt.rank() + 1)
        expected = base * sum(r + 1 for r in range(world))
        row = []
        for mode in ("staged", "zero-copy"):
            t = torch.empty(n) if mode == "staged" else trt.empty(n)
            name = f"pybench.{mode}.{size}"
            total = 0.0
            for i in range(args.warmup + args.iters):
                t.copy_(values)  # refill: one pass, as bench-rank's FillInput
                start = time.perf_counter()
                trt.push_pull(t, average=False, name=name)
                if i >= args.warmup:
                    total += time.perf_counter() - start
            if not torch.equal(t, expected):
                print(f"rank {trt.rank()}: wrong result, {mode} {size} B", file=sys.stderr)
                return 1
            row.append(total / args.iters * 1e6)
        if trt.rank() == 0:
            print(f"PY,{size},{row[0]:.3f},{row[1]:.3f}", flush=True)
    trt.barrier()
    trt.shutdown()
    return 0


def run_job(run, job, command):
    """Runs `command` as the 4 ranks of a new job; returns rank 0's stdout lines."""
    p = subprocess.run(run + ["--job", job, "--"] + command, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"job {job} failed ({p.returncode})")
    return [line[4:] for line in p.stdout.splitlines() if line.startswith("[0] ")]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default="build/bin")
    parser.add_argument("--sizes", default="4K,64M", help="comma-separated, K/M suffixes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    bin_dir = os.path.abspath(args.bin_dir)
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"),
               UCX_TLS=os.environ.get("UCX_TLS", "tcp"))
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as run_dir:
        cluster = subprocess.Popen(
            [os.path.join(bin_dir, "tributary"), "local-cluster", "--workers", "2", "--spares",
             "2", "--no-emulate-nic", "--nic-gbps", "10", "--run-dir", run_dir],
            stdout=subprocess.PIPE, text=True)
        try:
            controller = None
            for line in cluster.stdout:
                m = re.search(r"local cluster up: controller (\S+),", line)
                if m:
                    controller = m.group(1)
                    break
            if controller is None:
                raise SystemExit("tributary local-cluster did not start")
            run = [os.path.join(bin_dir, "tributary-run"), "--controller", controller,
                   "--workers", "worker-0,worker-1", "--agents",
                   f"unix:{run_dir}/worker-0.sock,unix:{run_dir}/worker-1.sock", "--np", "4",
                   "--procs-per-node", "2", "--spares", "2", "--algorithm", args.algorithm]
            cpp, py = {}, {}
            bench_rank = ("exec " + os.path.join(bin_dir, "tributary") +
                          " bench-rank --job $TRIBUTARY_JOB --agent $TRIBUTARY_AGENT_ADDRESS"
                          " --local-rank $TRIBUTARY_LOCAL_RANK --local-size "
                          "$TRIBUTARY_LOCAL_SIZE --dtype float32 --op sum --csv --no-check "
                          f"--sizes {args.sizes} --iters {args.iters} --warmup {args.warmup}")
            python = [sys.executable, os.path.abspath(__file__), "--rank", "--sizes", args.sizes,
                      "--iters", str(args.iters), "--warmup", str(args.warmup)]
            for r in range(args.rounds):
                # Which side goes first alternates, so that neither always follows the other.
                sides = ["cpp", "py"] if r % 2 == 0 else ["py", "cpp"]
                for side in sides:
                    if side == "cpp":
                        for line in run_job(run, f"cpp-{r}", ["/bin/sh", "-c", bench_rank]):
                            if line.startswith("CSV,"):
                                f = line.split(",")
                                cpp.setdefault(int(f[1]), []).append(float(f[5]))
                    else:
                        for line in run_job(run, f"py-{r}", python):
                            if line.startswith("PY,"):
                                f = line.split(",")
                                py.setdefault(int(f[1]), []).append((float(f[2]), float(f[3])))
                print(f"# round {r}: " + "; ".join(
                    f"{size} B: C++ {cpp[size][-1]:.1f} us, staged {py[size][-1][0]:.1f} us, "
                    f"0-copy {py[size][-1][1]:.1f} us" for size in sorted(cpp)), flush=True)
        finally:
            cluster.send_signal(signal.SIGINT)
            cluster.wait(timeout=60)
    print(f"# push_pull overhead: 4 ranks (2 agents x 2 processes) + 2 spares on one local "
          f"cluster (loopback, UCX tcp), float32 sum, algorithm {args.algorithm}; mean time per "
          f"operation over {args.iters} iterations after {args.warmup} warm-up, best of "
          f"{args.rounds} rounds; ratio = Python / C++ (bench-rank)")
    print(f"{'size':>10} {'C++ us':>12} {'staged us':>12} {'ratio':>7} {'0-copy us':>12} "
          f"{'ratio':>7}")
    for size in sorted(cpp):
        c = min(cpp[size])
        staged = min(p[0] for p in py[size])
        zero = min(p[1] for p in py[size])
        print(f"{size:>10} {c:>12.1f} {staged:>12.1f} {staged / c:>7.3f} {zero:>12.1f} "
              f"{zero / c:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
