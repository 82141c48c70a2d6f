#!/usr/bin/env python3
"""Python overhead of tributary.torch.push_pull against the C++ client, on one local cluster.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/push_pull_overhead.py --bin-dir build/bin

starts `tributary-run --np 4 --procs-per-node 2 --spares 2` with this script as every rank. Each
rank first runs the C++ client's sweep (`tributary bench-rank`, sum, float32, its session then
leaves), then joins the same job from Python and times, per size, `push_pull(average=False)` on
(a) an ordinary tensor (staged: one copy into a pooled shared buffer and one back) and (b) a
tensor from `tributary.torch.empty` (zero copy). Time per operation = mean over --iters after
--warmup, as bench-rank measures it (submit to completion, each rank on its own; the inputs are
refilled outside the timed region). Rank 0 prints one table; every result is checked.
"""

import argparse
import os
import subprocess
import sys
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def rank_main(args):
    import torch
    import tributary.torch as trt

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    env = os.environ
    # 1. The C++ client (its own session in this job; it leaves before Python joins).
    cpp = subprocess.run(
        [os.path.join(args.bin_dir, "tributary"), "bench-rank", "--job", env["TRIBUTARY_JOB"],
         "--agent", env["TRIBUTARY_AGENT_ADDRESS"], "--local-rank", env["TRIBUTARY_LOCAL_RANK"],
         "--local-size", env["TRIBUTARY_LOCAL_SIZE"], "--sizes", args.sizes, "--dtype",
         "float32", "--op", "sum", "--iters", str(args.iters), "--warmup", str(args.warmup),
         "--csv"], capture_output=True, text=True)
    if cpp.returncode != 0:
        sys.stderr.write(cpp.stdout + cpp.stderr)
        return 1
    cpp_us = {}
    for line in cpp.stdout.splitlines():
        if line.startswith("CSV,"):
            f = line.split(",")
            cpp_us[int(f[1])] = float(f[5])

    # 2. Python, same job, same sizes.
    trt.init()
    world = trt.size()
    results = []
    for size in sizes:
        n = size // 4
        base = (torch.arange(n, dtype=torch.float32) % 7 + 1)
        expected = base * sum(r + 1 for r in range(world))
        row = []
        for mode in ("staged", "zero-copy"):
            t = torch.empty(n) if mode == "staged" else trt.empty(n)
            name = f"pybench.{mode}.{size}"
            total = 0.0
            for i in range(args.warmup + args.iters):
                t.copy_(base * (trt.rank() + 1))
                start = time.perf_counter()
                trt.push_pull(t, average=False, name=name)
                if i >= args.warmup:
                    total += time.perf_counter() - start
                if not torch.equal(t, expected):
                    print(f"rank {trt.rank()}: wrong result, {mode} {size} B", file=sys.stderr)
                    return 1
            row.append(total / args.iters * 1e6)
        results.append((size, row))
    trt.barrier()
    if trt.rank() == 0:
        print(f"# push_pull overhead: {world} ranks (2 agents x 2) + 2 spares, loopback, "
              f"float32 sum, {args.iters} iterations after {args.warmup} warm-up; time per "
              "operation in us; ratio = Python / C++")
        print(f"{'size':>10} {'C++ us':>12} {'staged us':>12} {'ratio':>7} {'0-copy us':>12} "
              f"{'ratio':>7}")
        for size, (staged, zero) in results:
            c = cpp_us.get(size, float("nan"))
            print(f"{size:>10} {c:>12.1f} {staged:>12.1f} {staged / c:>7.3f} {zero:>12.1f} "
                  f"{zero / c:>7.3f}")
        sys.stdout.flush()
    trt.shutdown()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default="build/bin")
    parser.add_argument("--sizes", default="4K,64M", help="comma-separated, K/M suffixes")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank_main(args)
    bin_dir = os.path.abspath(args.bin_dir)
    command = [os.path.join(bin_dir, "tributary-run"), "--np", "4", "--procs-per-node", "2",
               "--spares", "2", "--algorithm", args.algorithm, "--", sys.executable,
               os.path.abspath(__file__), "--rank", "--bin-dir", bin_dir, "--sizes", args.sizes,
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
