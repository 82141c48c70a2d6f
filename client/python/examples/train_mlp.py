"""Trains a small MLP on a synthetic classification dataset with tributary.torch.

    build/bin/tributary-run --np 4 --procs-per-node 2 --spares 2 -- \
        env PYTHONPATH=build/python /usr/bin/python3 client/python/examples/train_mlp.py

Every rank generates the same dataset from --seed (points around CLASSES centres), trains on
its share of each batch, and the gradients are averaged over all ranks by
DistributedOptimizer; rank 0 prints the loss and accuracy.

Asynchronous parameter-server training (--mode async; the job must be created async too):

    build/bin/tributary-run --np 4 --procs-per-node 2 --spares 1 --mode async --staleness 2 \
        --delta-scale 0.25 -- env PYTHONPATH=build/python /usr/bin/python3 \
        client/python/examples/train_mlp.py --mode async

Each rank steps its local optimizer and pushes the change of its parameters to the summation
servers, which add every rank's changes (scaled by --delta-scale: 1/4 makes 4 ranks' steps
one averaged step, as in the synchronous run), then pulls the current parameters; no rank
waits for another unless it runs more than --staleness steps ahead of the slowest.
"""

import json

import argparse
import time

import torch

import tributary.torch as trt


def dataset(seed, samples, features, classes):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g) * 0.3
    labels = torch.randint(0, classes, (samples,), generator=g)
    points = centres[labels] + torch.randn(samples, features, generator=g)
    return points, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--fp16", action="store_true", help="fp16 gradient compression")
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--staleness", type=int, default=None,
                        help="async: the job's staleness bound (checked against it)")
    parser.add_argument("--log-every", type=int, default=0,
                        help="rank 0 also evaluates the loss every N steps (0: per epoch)")
    parser.add_argument("--log-json", default=None,
                        help="rank 0 writes [{step, epoch, loss, accuracy}, ...] here")
    args = parser.parse_args()

    trt.init()
    if args.batch % trt.size() != 0:
        raise SystemExit(f"--batch {args.batch} is not a multiple of {trt.size()} ranks")
    x, y = dataset(args.seed, args.samples, args.features, args.classes)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(args.features, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, args.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.mode == "sync":
        # Every rank starts from rank 0's weights and optimizer state.
        trt.broadcast_parameters(model.state_dict(), root_rank=0)
        trt.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = trt.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=trt.Compression.fp16 if args.fp16 else trt.Compression.none)
    else:
        # The servers' parameters start from rank 0's weights, on every rank.
        optimizer = trt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             mode="async", staleness=args.staleness)

    share = args.batch // trt.size()
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.monotonic()
    log = []

    def evaluate(step, epoch):
        with torch.no_grad():
            logits = model(x)
            loss = loss_fn(logits, y).item()
            accuracy = (logits.argmax(1) == y).float().mean().item()
        log.append({"step": step, "epoch": epoch, "loss": loss, "accuracy": accuracy})
        return loss, accuracy

    step = 0
    if trt.rank() == 0 and args.log_every:
        evaluate(0, 0)
    for epoch in range(args.epochs):
        for first in range(0, args.samples - args.batch + 1, args.batch):
            lo = first + trt.rank() * share
            optimizer.zero_grad()
            loss_fn(model(x[lo:lo + share]), y[lo:lo + share]).backward()
            optimizer.step()
            step += 1
            if trt.rank() == 0 and args.log_every and step % args.log_every == 0:
                evaluate(step, epoch)
        if trt.rank() == 0:
            if not log or log[-1]["step"] != step:
                evaluate(step, epoch)
            loss, accuracy = log[-1]["loss"], log[-1]["accuracy"]
            print(f"epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.3f} "
                  f"({time.monotonic() - start:.1f} s)", flush=True)
    if trt.rank() == 0 and args.log_json:
        with open(args.log_json, "w") as f:
            json.dump(log, f)
    trt.shutdown()


if __name__ == "__main__":
    main()
