#!/usr/bin/python3
"""One rank of a PyTorch training-iteration benchmark: torchvision's ResNet-50 (its real
parameters: 161 tensors, 25,557,032 floats), random data, CPU compute, SGD.

  --mode tributary   tributary.torch.DistributedOptimizer (gradient hooks start each all-reduce
                     as backward produces it; priorities by layer order with --overlap-forward
                     or --layer-priorities, otherwise in backward order, the optimizer's
                     default); the process joins the job named by TRIBUTARY_JOB through
                     TRIBUTARY_AGENT_ADDRESS.
                     With --overlap-forward, DistributedOptimizer(overlap_forward=model): step()
                     returns at once and each layer's update is applied just before the next
                     forward pass reaches it (the last timed iteration includes applying the
                     last updates).
  --mode ddp-gloo    torch.nn.parallel.DistributedDataParallel over torch.distributed's own Gloo
                     backend (25 MiB buckets, overlapped with backward), rendezvous at --master.
  --mode ddp-tributary
                     the same unmodified DDP over the "tributary" backend
                     (init_process_group("tributary"), client/python/c10d): each bucket one
                     all-reduce of the job named by TRIBUTARY_JOB, as ddp-gloo's are Gloo's.

Every rank first times `--compute-iters` iterations of forward + backward + step without any
communication (the compute part), then `--iters` distributed iterations after `--warmup`. The
communication part of an iteration = distributed iteration time - compute time: the time the
iteration waits for the network (what overlap could not hide). After the timed iterations the
ranks check that every rank holds the same parameters (a sum of all of them, all-reduced as a
float64 checksum by the mode's own collective, must be size x rank 0's): a wrong sum fails the run.

Rank 0 prints two lines:
  TORCHITER,mode,ranks,iter_ms,compute_ms,comm_ms,iters,param_mismatch
  WTIMED,from,to      the timed iterations' window, time.monotonic() seconds (the suite meters
                      the hosts' CPU in it)
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torchvision


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["tributary", "ddp-gloo", "ddp-tributary"], required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=2, help="images per rank per iteration")
    ap.add_argument("--image", type=int, default=64, help="image side (the gradients' size "
                    "does not depend on it; smaller keeps CPU compute short)")
    ap.add_argument("--iters", type=int, default=3)
    # Two: DDP rebuilds its buckets after the first iteration, so the second is the first with
    # the buckets it keeps (new sizes: new staging buffers and kept sums on the Tributary
    # backend, fresh pages to fault in); the timed iterations are the steady state's.
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compute-iters", type=int, default=3)
    ap.add_argument("--overlap-forward", action="store_true",
                    help="tributary: overlap the next forward pass with the communication")
    ap.add_argument("--layer-priorities", action="store_true",
                    help="tributary: DistributedOptimizer(priorities=True) (first layers first) "
                    "without --overlap-forward too")
    ap.add_argument("--rank", type=int, default=0, help="ddp-*: this rank")
    ap.add_argument("--world", type=int, default=1, help="ddp-*: number of ranks")
    ap.add_argument("--master", default="127.0.0.1:29500", help="ddp-*: rendezvous HOST:PORT")
    ap.add_argument("--ifname", default=None, help="ddp-gloo: GLOO_SOCKET_IFNAME")
    return ap.parse_args()


def batch_for(args, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(args.batch, 3, args.image, args.image, generator=g)
    y = torch.randint(0, 1000, (args.batch,), generator=g)
    return x, y


def timed_iterations(model, optimizer, args, count, seed0, finish=None):
    """Per-iteration times; finish() (when given) runs at the end of the last iteration, inside
    its time: the updates an overlapped step() left pending."""
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(count):
        x, y = batch_for(args, seed0 + i)
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if finish is not None and i == count - 1:
            finish()
        times.append(time.perf_counter() - t0)
    return times


def main():
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)()
    # The compute part: the same iteration without any communication.
    plain = torch.optim.SGD(model.parameters(), lr=0.0)
    timed_iterations(model, plain, args, 1, 1000)
    compute = statistics.median(timed_iterations(model, plain, args, args.compute_iters, 2000))

    if args.mode == "tributary":
        import tributary.torch as trt
        trt.init(op_timeout=600.0)
        rank, world = trt.rank(), trt.size()
        trt.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = trt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.0), named_parameters=model.named_parameters(),
            overlap_forward=model if args.overlap_forward else None,
            priorities=True if args.layer_priorities else None)
        net = model
        finish = optimizer.synchronize if args.overlap_forward else None

        def checksum_sum(t):
            return trt.push_pull(t, average=False, name="checksum")
    else:
        import torch.distributed as dist
        host, port = args.master.rsplit(":", 1)
        if args.ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
        backend = "gloo"
        if args.mode == "ddp-tributary":
            import tributary.distributed  # noqa: F401  (registers the "tributary" backend)
            backend = "tributary"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=args.rank,
                                world_size=args.world)
        rank, world = dist.get_rank(), dist.get_world_size()
        net = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
        finish = None

        def checksum_sum(t):
            dist.all_reduce(t)
            return t

    timed_iterations(net, optimizer, args, args.warmup, 3000 + 100 * rank)
    # The timed iterations' window on CLOCK_MONOTONIC: the suite meters the hosts' CPU in it.
    timed_from = time.monotonic()
    times = timed_iterations(net, optimizer, args, args.iters, 4000 + 100 * rank, finish)
    timed_to = time.monotonic()
    # lr = 0: the parameters must still be rank 0's (broadcast / DDP's initial sync), on every rank.
    mine = torch.tensor([sum(float(p.double().sum()) for p in model.parameters())],
                        dtype=torch.float64)
    total = checksum_sum(mine.clone())
    mismatch = int(abs(float(total[0]) - world * float(mine[0])) > 1e-6 * abs(world * float(mine[0])))
    it = statistics.median(times)
    if rank == 0:
        mode = (args.mode + ("-overlap" if args.overlap_forward else "") +
                ("-layer-priorities" if args.layer_priorities else ""))
        print(f"TORCHITER,{mode},{world},{it * 1e3:.1f},{compute * 1e3:.1f},"
              f"{max(0.0, it - compute) * 1e3:.1f},{args.iters},{mismatch}", flush=True)
        print(f"WTIMED,{timed_from:.6f},{timed_to:.6f}", flush=True)
    if args.mode == "tributary":
        import tributary.torch as trt
        trt.shutdown()
    else:
        import torch.distributed as dist
        dist.destroy_process_group()
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
