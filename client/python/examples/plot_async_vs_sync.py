"""Trains examples/train_mlp.py with 4 ranks synchronously and asynchronously (parameter server,
staleness 2) and plots both loss curves into one PNG.

    /usr/bin/python3 client/python/examples/plot_async_vs_sync.py --build build \
        --out client/python/examples/async_vs_sync.png

Each run is its own local cluster (tributary-run: 2 agents x 2 ranks + 1 spare). Rank 0
evaluates the loss on the whole dataset every --log-every steps. The asynchronous run uses
--delta-scale 1/4: the servers add a quarter of each rank's parameter change, so 4 ranks'
steps make one averaged step, as the synchronous run's averaged gradients do. Prints the final
losses as a Markdown table.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run(build, mode, staleness, args, log):
    cmd = [os.path.join(build, "bin", "tributary-run"), "--np", "4", "--procs-per-node", "2",
           "--spares", "1"]
    train = [sys.executable, os.path.join(HERE, "train_mlp.py"), "--epochs", str(args.epochs),
             "--log-every", str(args.log_every), "--log-json", log, "--seed", str(args.seed)]
    if mode == "async":
        cmd += ["--mode", "async", "--staleness", str(staleness), "--delta-scale", "0.25"]
        train += ["--mode", "async", "--staleness", str(staleness)]
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), UCX_NET_DEVICES="lo",
               UCX_TLS="tcp")
    subprocess.run(cmd + ["--"] + train, check=True, env=env)
    with open(log) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--out", default=os.path.join(HERE, "async_vs_sync.png"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--log-every", type=int, default=16)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        curves = {
            "synchronous (all-reduce)": run(args.build, "sync", None, args,
                                            os.path.join(tmp, "sync.json")),
            f"asynchronous (parameter server, staleness {args.staleness})":
                run(args.build, "async", args.staleness, args, os.path.join(tmp, "async.json")),
        }
    plt.figure(figsize=(7, 4))
    for label, log in curves.items():
        plt.plot([e["step"] for e in log], [e["loss"] for e in log], label=label)
    plt.xlabel("step (global batch of 64, 16 samples per rank)")
    plt.ylabel("loss on the whole dataset (rank 0)")
    plt.title("train_mlp.py, 4 ranks")
    plt.grid(alpha=0.3)
    plt.legend()
    plt.tight_layout()
    plt.savefig(args.out, dpi=100)
    print(f"wrote {args.out}\n")
    print("| run | first loss | final loss | final accuracy |")
    print("|---|---|---|---|")
    for label, log in curves.items():
        print(f"| {label} | {log[0]['loss']:.4f} | {log[-1]['loss']:.4f} | "
              f"{log[-1]['accuracy']:.3f} |")


if __name__ == "__main__":
    main()
