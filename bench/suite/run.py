#!/usr/bin/python3
"""The emulated-cluster benchmark suite: Tributary against Gloo and Open MPI on shaped namespaces.

One command builds the peers, brings up an emulated cluster (scripts/emulated_cluster.sh), runs
every configuration on it in one run, and writes a markdown table, a CSV and a PNG plot:

  bench/suite/run.py                 # 4 workers + 4 spare hosts at 500 Mbit/s, 4 KiB..256 MiB
  bench/suite/run.py --quick         # 2 workers + 1 spare at 1 Gbit/s, 4..256 KiB, seconds

Configurations: Tributary push/pull with at most k = 0, 1, 2, 4 spare summation hosts, Tributary
ring and halving-doubling, Gloo ring and halving-doubling, Open MPI default and forced ring.
Times are rank 0's mean per all-reduce, as nccl-tests and `tributary bench-rank` report them;
every element is checked after every timed iteration.

Exit codes: 0 done (targets missed are reported, not failures), 1 an error or wrong results,
77 skipped (not root, or network namespaces cannot be created here).
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(ROOT, "scripts", "emulated_cluster.sh")
SKIP = 77
TCP_EFFICIENCY = 0.956  # TCP payload through tbf per unit of shaped rate (1448 B of 1514 B).
MIB = 1 << 20
# The cluster's names and subnet (scripts/emulated_cluster.sh TRIB_EMU_NAME / TRIB_EMU_NET); the
# quick mode uses its own so that a CI run cannot tear down a full run's cluster.
NS, SUBNET = "trib-h", "198.18.0"


def log(msg):
    print(msg, flush=True)


def parse_size(text):
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def parse_sizes(text):
    if ":" in text:
        lo, hi = (parse_size(t) for t in text.split(":"))
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    return [parse_size(t) for t in text.split(",") if t]


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            v = b / div
            return f"{v:g} {unit}"
    return f"{b} B"


def run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


# ---------------------------------------------------------------------------------------------
# Preconditions and peers


def can_use_namespaces():
    if os.geteuid() != 0:
        return "not root (network namespaces need root)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is missing"
    probe = f"trib-probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot create a network namespace: " + r.stderr.strip()
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ensure_packages(install):
    """Installs libgloo-dev, libopenmpi-dev, openmpi-bin, python3-matplotlib when missing."""
    missing = []
    if not os.path.exists("/usr/include/gloo/allreduce.h"):
        missing.append("libgloo-dev")
    if not shutil.which("mpicxx"):
        missing.append("libopenmpi-dev")
    if not shutil.which("mpirun"):
        missing.append("openmpi-bin")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        missing.append("python3-matplotlib")
    if missing and install:
        log(f"# installing {' '.join(missing)} with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y",
                        "--no-install-recommends"] + missing, env=env, check=False,
                       stdout=subprocess.DEVNULL)
    elif missing:
        log(f"# not installing {' '.join(missing)} (--no-install): those peers/plots are skipped")


def build_peers(bin_dir, work):
    """Returns {"gloo": path or None, "mpi": path or None}: the CMake-built peers, else compiled."""
    peers = {}
    for name, exe, compiler, libs in (("gloo", "gloo_allreduce_peer", "g++", ["-lgloo", "-lpthread"]),
                                      ("mpi", "mpi_allreduce_peer", "mpicxx", [])):
        built = os.path.join(bin_dir, exe)
        if os.access(built, os.X_OK):
            peers[name] = built
            continue
        if not shutil.which(compiler) or (name == "gloo" and
                                          not os.path.exists("/usr/include/gloo/allreduce.h")):
            log(f"# {name} peer skipped: {compiler} or its headers are missing")
            peers[name] = None
            continue
        out = os.path.join(work, exe)
        r = run([compiler, "-O2", "-std=c++17", "-I", HERE, os.path.join(HERE, exe + ".cc"),
                 "-o", out] + libs, check=False)
        if r.returncode != 0:
            log(f"# {name} peer did not compile, skipped:\n{r.stderr[-2000:]}")
            peers[name] = None
        else:
            peers[name] = out
    return peers


# ---------------------------------------------------------------------------------------------
# CPU use per host: a poller sums utime+stime of every process in each host's namespace.


class CpuMeter:
    def __init__(self, hosts):
        self.hosts = hosts
        self.tick = os.sysconf("SC_CLK_TCK")
        self.seen = {}  # (host, pid, starttime) -> last cpu ticks
        self.base = {}
        self.stop_flag = threading.Event()
        self.thread = None

    def _sample(self):
        out = {}
        for h in self.hosts:
            r = subprocess.run(["ip", "netns", "pids", f"{NS}{h}"], capture_output=True,
                               text=True)
            for pid in r.stdout.split():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
                    out[(h, pid, fields[19])] = ticks
                except (OSError, IndexError, ValueError):
                    pass
        return out

    def _loop(self):
        while not self.stop_flag.wait(0.25):
            self.seen.update(self._sample())

    def start(self):
        self.base = self._sample()
        self.seen = dict(self.base)
        self.t0 = time.monotonic()
        self.stop_flag.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self):
        """Returns {host: CPU use in % of one core over the window}."""
        self.stop_flag.set()
        self.thread.join()
        self.seen.update(self._sample())
        wall = max(time.monotonic() - self.t0, 1e-6)
        use = {h: 0.0 for h in self.hosts}
        for key, ticks in self.seen.items():
            use[key[0]] += (ticks - self.base.get(key, 0)) / self.tick
        return {h: 100.0 * s / wall for h, s in use.items()}


# ---------------------------------------------------------------------------------------------
# Runners: each returns {size: row dict} from rank 0's CSV lines.


def parse_csv_lines(text):
    rows = {}
    for line in text.splitlines():
        if not line.startswith("CSV,"):
            continue
        c = line.split(",")
        if len(c) != 9 or c[1] == "size":
            continue
        rows[int(c[1])] = {"time_us": float(c[5]), "algbw": float(c[6]), "busbw": float(c[7]),
                           "wrong": int(c[8])}
    return rows


def wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(-9)
    return codes


class Suite:
    def __init__(self, args, peers, bin_dir, work):
        self.args = args
        self.peers = peers
        self.bin = bin_dir
        self.work = work
        self.n = args.workers
        self.hosts = list(range(args.workers + max(args.k)))
        self.controller = None
        self.counter = 0

    def bands(self):
        """(sizes string, iters) bands: fewer iterations from --large-from."""
        sizes = parse_sizes(self.args.sizes)
        large = parse_size(self.args.large_from)
        small = [s for s in sizes if s < large]
        big = [s for s in sizes if s >= large]
        out = []
        if small:
            out.append((",".join(map(str, small)), self.args.iters))
        if big:
            out.append((",".join(map(str, big)), self.args.large_iters))
        return out

    def tributary(self, algorithm, k):
        rows, plan = {}, None
        workers = ",".join(f"h{i}" for i in range(self.n))
        for sizes, iters in self.bands():
            self.counter += 1
            job = f"suite-{algorithm}-{k}-{self.counter}"
            largest = max(int(s) for s in sizes.split(","))
            r = run([os.path.join(self.bin, "suite_create_job"), "--controller", self.controller,
                     "--job", job, "--workers", workers, "--spares", str(k), "--algorithm",
                     algorithm, "--model-bytes", str(largest), "--timeout-ms", "300000"],
                    check=False)
            if r.returncode != 0:
                raise RuntimeError(f"create job {job}: {r.stderr.strip()}")
            plan = r.stdout.strip().split(",")
            procs, logs = [], []
            for i in range(self.n):
                path = os.path.join(self.work, f"{job}-{i}.out")
                logs.append(path)
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", f"{NS}{i}", "env", "UCX_TLS=tcp",
                     "UCX_NET_DEVICES=eth0", os.path.join(self.bin, "tributary"), "bench-rank",
                     "--agent", f"unix:{self.args.run_dir}/sock/h{i}.sock", "--job", job,
                     "--sizes", sizes, "--iters", str(iters), "--warmup", str(self.args.warmup),
                     "--csv", "--log-level", "warn", "--op-timeout-ms", "300000"],
                    stdout=open(path, "w"), stderr=subprocess.STDOUT))
            codes = wait_all(procs, self.args.timeout)
            run([os.path.join(self.bin, "suite_create_job"), "--controller", self.controller,
                 "--delete", job], check=False)
            if any(codes):
                raise RuntimeError(f"{job}: exit codes {codes}; rank 0 says:\n" +
                                   open(logs[0]).read()[-2000:])
            rows.update(parse_csv_lines(open(logs[0]).read()))
        spares_used = int(plan[2]) if plan else 0
        return rows, spares_used

    def gloo(self, algorithm):
        rows = {}
        for sizes, iters in self.bands():
            store = tempfile.mkdtemp(prefix="gloo-store-", dir=self.work)
            procs, logs = [], []
            for i in range(self.n):
                path = os.path.join(self.work, f"gloo-{algorithm}-{i}-{self.counter}.out")
                self.counter += 1
                logs.append(path)
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", f"{NS}{i}", self.peers["gloo"], "--rank", str(i),
                     "--size", str(self.n), "--store-dir", store, "--hostname",
                     f"{SUBNET}.{i + 1}", "--algorithm", algorithm, "--sizes", sizes, "--iters",
                     str(iters), "--large-iters", str(iters), "--warmup", str(self.args.warmup)],
                    stdout=open(path, "w"), stderr=subprocess.STDOUT))
            codes = wait_all(procs, self.args.timeout)
            if any(codes):
                raise RuntimeError(f"gloo {algorithm}: exit codes {codes}:\n" +
                                   open(logs[0]).read()[-2000:])
            rows.update(parse_csv_lines(open(logs[0]).read()))
        return rows

    def mpi(self, algorithm):
        rows = {}
        forced = []
        if algorithm == "ring":
            forced = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca",
                      "coll_tuned_allreduce_algorithm", "4"]
        for sizes, iters in self.bands():
            cmd = (["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(self.n),
                    "--host", ",".join(f"{NS}{i}" for i in range(self.n)),
                    "--mca", "plm_rsh_agent", os.path.join(HERE, "netns_rsh.sh"),
                    "--mca", "oob_tcp_if_include", f"{SUBNET}.0/24",
                    "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                    "--mca", "btl_tcp_if_include", f"{SUBNET}.0/24",
                    "--mca", "mpi_yield_when_idle", "1"] + forced +
                   [self.peers["mpi"], "--algorithm", algorithm, "--sizes", sizes, "--iters",
                    str(iters), "--large-iters", str(iters), "--warmup", str(self.args.warmup)])
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.timeout,
                               env=dict(os.environ, OMPI_MCA_plm_rsh_no_tree_spawn="1"))
            if r.returncode != 0:
                raise RuntimeError(f"mpi {algorithm}: exit {r.returncode}:\n" +
                                   (r.stdout + r.stderr)[-2000:])
            rows.update(parse_csv_lines(r.stdout))
        return rows


# ---------------------------------------------------------------------------------------------
# Theory, table, targets, plot


def theory_seconds(size, n, k, rate_mbit):
    """DESIGN.md §1.1 with B the TCP payload rate through tbf; k = 0 is ring all-reduce."""
    b = rate_mbit * 1e6 / 8 * TCP_EFFICIENCY
    k = min(k, n)
    d = n * n + k * n - 2 * k
    return 2 * n * (n - 1) * size / (d * b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 workers + 1 spare at 1 Gbit/s, 4K:256K, for CI (seconds)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--k", default="0,1,2,4", help="push/pull spare counts")
    ap.add_argument("--rate", type=int, default=500, help="NIC rate per host, Mbit/s")
    ap.add_argument("--sizes", default="4K:256M")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations below --large-from")
    ap.add_argument("--large-iters", type=int, default=2, help="timed iterations from --large-from")
    ap.add_argument("--large-from", default="16M")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--configs", default="all",
                    help="comma list of: pp,trib-ring,trib-hd,gloo-ring,gloo-hd,mpi-default,mpi-ring")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    ap.add_argument("--run-dir", default="/tmp/trib-emu-suite")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per sweep")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get missing packages")
    ap.add_argument("--update-benchmarks-md", action="store_true",
                    help="replace the results block of BENCHMARKS.md (default in full mode)")
    ap.add_argument("--merge", default=None,
                    help="a CSV of an earlier run: its rows of configs not run now are kept")
    args = ap.parse_args()
    argv = " ".join(sys.argv[1:])
    global NS, SUBNET
    name, net = ("tribq", "1") if args.quick else ("trib", "0")
    os.environ["TRIB_EMU_NAME"], os.environ["TRIB_EMU_NET"] = name, net
    NS, SUBNET = f"{name}-h", f"198.18.{net}"
    if args.quick:
        if args.run_dir == "/tmp/trib-emu-suite":
            args.run_dir = "/tmp/tribq-emu-suite"
        args.workers, args.k, args.rate = 2, "0,1", 1000
        args.sizes, args.iters, args.large_iters, args.warmup = "4K:256K", 3, 2, 1
        args.no_install = True
    args.k = [int(x) for x in args.k.split(",") if x != ""]
    out = args.out or (os.path.join(ROOT, "build", "emulated-quick") if args.quick
                       else os.path.join(ROOT, "bench", "results"))
    update_md = args.update_benchmarks_md or not args.quick

    why = can_use_namespaces()
    if why:
        log(f"SKIP: emulated-cluster suite not run: {why}")
        return SKIP
    for exe in ("tributary", "tributary-agent", "tributary-controller", "suite_create_job"):
        if not os.access(os.path.join(args.bin_dir, exe), os.X_OK):
            log(f"error: {args.bin_dir}/{exe} is missing: build first (--bin-dir)")
            return 1
    ensure_packages(not args.no_install)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="trib-suite-")
    peers = build_peers(args.bin_dir, work)
    wanted = args.configs.split(",") if args.configs != "all" else [
        "pp", "trib-ring", "trib-hd", "gloo-ring", "gloo-hd", "mpi-default", "mpi-ring"]
    if args.quick:
        wanted = [c for c in wanted if c not in ("gloo-hd", "mpi-ring")]

    suite = Suite(args, peers, args.bin_dir, work)
    nhosts = len(suite.hosts)
    env = dict(os.environ, TRIBUTARY_BIN_DIR=args.bin_dir)
    results = []  # dicts: config, family, k, spares_used, size, time_us, algbw, busbw, wrong, cpu
    failed = False

    def cleanup():
        subprocess.run([CLUSTER, "down"], env=env, capture_output=True)

    try:
        log(f"# emulated cluster: {nhosts} hosts at {args.rate} Mbit/s; {args.workers} workers")
        r = run([CLUSTER, "up", str(nhosts), str(args.rate)], env=env, check=False)
        if r.returncode != 0:
            log(f"SKIP: emulated cluster could not be created: {r.stderr.strip()}")
            cleanup()
            return SKIP
        shutil.rmtree(args.run_dir, ignore_errors=True)
        r = run([CLUSTER, "start-tributary", args.run_dir, "--sum-gbps", "4"], env=env,
                check=False)
        if r.returncode != 0:
            raise RuntimeError("start-tributary failed: " + r.stderr + r.stdout)
        suite.controller = r.stdout.strip().splitlines()[-1].split("=", 1)[1]
        meter = CpuMeter(suite.hosts)

        configs = []
        if "pp" in wanted:
            configs += [(f"tributary push/pull k={k}", "tributary", k,
                         lambda k=k: suite.tributary("push-pull", k)) for k in args.k]
        if "trib-ring" in wanted:
            configs.append(("tributary ring", "tributary", 0, lambda: suite.tributary("ring", 0)))
        if "trib-hd" in wanted:
            configs.append(("tributary halving-doubling", "tributary", 0,
                            lambda: suite.tributary("hd", 0)))
        for name, fam, alg in (("gloo-ring", "gloo", "ring"), ("gloo-hd", "gloo", "hd"),
                               ("mpi-default", "mpi", "default"), ("mpi-ring", "mpi", "ring")):
            if name not in wanted:
                continue
            if not peers.get(fam) or (fam == "mpi" and not shutil.which("mpirun")):
                log(f"# {name} skipped: peer not available")
                continue
            label = {"gloo": "Gloo", "mpi": "Open MPI"}[fam] + " " + {
                "ring": "ring", "hd": "halving-doubling", "default": "default"}[alg]
            runner = (lambda a=alg: suite.gloo(a)) if fam == "gloo" else (lambda a=alg: suite.mpi(a))
            configs.append((label, fam, 0, runner))

        for label, fam, k, runner in configs:
            log(f"# running {label}")
            t0 = time.monotonic()
            meter.start()
            try:
                got = runner()
            except Exception as e:  # noqa: BLE001 - report and go on with the others
                meter.stop()
                log(f"error: {label}: {e}")
                failed = True
                continue
            cpu = meter.stop()
            spares_used = 0
            if isinstance(got, tuple):
                got, spares_used = got
            log(f"#   {len(got)} sizes in {time.monotonic() - t0:.1f} s; CPU % per host: " +
                " ".join(f"h{h}={v:.0f}" for h, v in cpu.items()))
            for size, row in sorted(got.items()):
                if row["wrong"]:
                    failed = True
                    log(f"error: {label}: {row['wrong']} wrong elements at {size} B")
                results.append(dict(config=label, family=fam, k=k, spares_used=spares_used,
                                    size=size, cpu=cpu, **row))
    except Exception as e:  # noqa: BLE001
        log(f"error: {e}")
        failed = True
    finally:
        cleanup()

    if args.merge and os.path.exists(args.merge):
        results = merge(results, args.merge)
    if not results:
        log("error: no results")
        return 1
    report(results, args, out, argv, update_md)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def merge(results, path):
    """Adds the rows of `path` (a CSV this script wrote) whose config did not run now."""
    ran = {r["config"] for r in results}
    old = []
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["config"] in ran:
                continue
            fam = ("gloo" if row["config"].startswith("Gloo") else
                   "mpi" if row["config"].startswith("Open MPI") else "tributary")
            k = int(row["config"].split("k=")[1]) if "k=" in row["config"] else 0
            cpu = {i: float(v) for i, v in enumerate(row["cpu_pct_per_host"].split())}
            old.append(dict(config=row["config"], family=fam, k=k,
                            spares_used=int(row["spares_used"]), size=int(row["size_bytes"]),
                            time_us=float(row["time_us"]), algbw=float(row["algbw_GBps"]),
                            busbw=float(row["busbw_GBps"]), wrong=int(row["wrong"]), cpu=cpu))
    log(f"# kept {len(old)} rows from {path}")
    return old + results


def report(results, args, out, argv, update_md):
    n, rate = args.workers, args.rate
    sizes = sorted({r["size"] for r in results})
    peers = [r for r in results if r["family"] in ("gloo", "mpi")]
    best_peer = {}
    for s in sizes:
        cand = [r for r in peers if r["size"] == s]
        if cand:
            best_peer[s] = min(cand, key=lambda r: r["time_us"])
    for r in results:
        kk = r["spares_used"] if r["config"].startswith("tributary push/pull") else 0
        r["theory_us"] = theory_seconds(r["size"], n, kk, rate) * 1e6
        r["efficiency"] = r["theory_us"] / r["time_us"]
        bp = best_peer.get(r["size"])
        r["vs_best_peer"] = bp["time_us"] / r["time_us"] if bp else float("nan")
        r["best_peer"] = bp["config"] if bp else ""
        r["cpu_max"] = max(r["cpu"].values())
        r["cpu_hosts"] = " ".join(f"{v:.0f}" for v in r["cpu"].values())

    csv_path = os.path.join(out, "emulated_allreduce.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "wrong",
                    "theory_us", "efficiency", "speedup_vs_best_peer", "best_peer",
                    "spares_used", "cpu_pct_per_host"])
        for r in results:
            w.writerow([r["config"], r["size"], f"{r['time_us']:.1f}", f"{r['algbw']:.4f}",
                        f"{r['busbw']:.4f}", r["wrong"], f"{r['theory_us']:.1f}",
                        f"{r['efficiency']:.3f}", f"{r['vs_best_peer']:.3f}", r["best_peer"],
                        r["spares_used"], r["cpu_hosts"]])

    lines = []
    lines.append(f"Emulated cluster: {n} workers (+ up to {max(args.k)} spare CPU hosts), "
                 f"{rate} Mbit/s per host each way (tc tbf), float32 sum, "
                 f"theory with B = {TCP_EFFICIENCY} x rate.")
    lines.append("")
    lines.append("Command: `bench/suite/run.py " + argv + "`" if argv else
                 "Command: `bench/suite/run.py`")
    lines.append("")
    lines.append("| config | size | time (us) | algbw (GB/s) | busbw (GB/s) | theory (us) | "
                 "efficiency | speed-up vs best peer | CPU % per host (sweep) | #wrong |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    configs = list(dict.fromkeys(r["config"] for r in results))
    for s in sizes:
        for c in configs:
            for r in results:
                if r["config"] == c and r["size"] == s:
                    name = c + (f" ({r['spares_used']} used)" if "push/pull" in c else "")
                    lines.append(
                        f"| {name} | {fmt_size(s)} | {r['time_us']:.0f} | {r['algbw']:.4f} | "
                        f"{r['busbw']:.4f} | {r['theory_us']:.0f} | {r['efficiency']:.2f} | "
                        f"{r['vs_best_peer']:.2f} | {r['cpu_hosts']} | {r['wrong']} |")
    lines.append("")
    lines.append("CPU % per host: CPU time of every process in host h0, h1, ... over that "
                 "configuration's whole sweep, in % of one core (agents included).")
    lines.append("")
    lines += targets(results, best_peer)
    md = "\n".join(lines) + "\n"
    md_path = os.path.join(out, "emulated_allreduce.md")
    with open(md_path, "w") as f:
        f.write(md)
    print("\n" + md, flush=True)
    plot(results, os.path.join(out, "emulated_allreduce.png"), n, rate)
    log(f"# wrote {csv_path}, {md_path}, {os.path.join(out, 'emulated_allreduce.png')}")
    if update_md:
        update_benchmarks_md(md)


def get(results, config_prefix, size):
    for r in results:
        if r["config"].startswith(config_prefix) and r["size"] == size:
            return r
    return None


def targets(results, best_peer):
    out = ["Targets:", ""]
    if not best_peer:
        return out + ["* no peer ran: nothing to compare with"]
    sizes = sorted(best_peer)
    # k = 0 at least as fast as the best peer from 16 MiB.
    big = [s for s in sizes if s >= 16 * MIB]
    if big:
        worst = None
        for s in big:
            r = get(results, "tributary push/pull k=0", s)
            if r and (worst is None or r["vs_best_peer"] < worst[1]):
                worst = (s, r["vs_best_peer"])
        if worst:
            ok = worst[1] >= 1.0
            out.append(f"* push/pull k=0 >= best peer from 16 MiB: {'MET' if ok else 'MISSED'} "
                       f"(worst {worst[1]:.2f}x at {fmt_size(worst[0])}"
                       + ("" if ok else f", {100 * (1 - worst[1]):.0f}% short") + ")")
    r = get(results, "tributary push/pull k=4", 64 * MIB)
    if r:
        ok = r["vs_best_peer"] >= 1.45
        out.append(f"* push/pull k=4 >= 1.45x best peer at 64 MiB: {'MET' if ok else 'MISSED'} "
                   f"({r['vs_best_peer']:.2f}x vs {r['best_peer']}"
                   + ("" if ok else f", {1.45 - r['vs_best_peer']:.2f}x short") + ")")
    trib = [r for r in results if r["family"] == "tributary" and r["size"] >= 16 * MIB]
    if trib:
        misses = [r for r in trib if r["time_us"] > 1.07 * r["theory_us"]]
        if not misses:
            out.append("* Tributary within 7% of theory from 16 MiB: MET")
        else:
            out.append(f"* Tributary within 7% of theory from 16 MiB: MISSED in "
                       f"{len(misses)} of {len(trib)} rows:")
            for r in misses:
                out.append(f"  * {r['config']} {fmt_size(r['size'])}: "
                           f"{100 * (r['time_us'] / r['theory_us'] - 1):.0f}% over theory")
    small = sizes[0]
    bp = best_peer[small]
    rows = [r for r in results if r["family"] == "tributary" and r["size"] == small]
    if rows:
        out.append(f"* {fmt_size(small)} latency <= best peer ({bp['config']}, "
                   f"{bp['time_us']:.0f} us):")
        for r in rows:
            ok = r["time_us"] <= bp["time_us"]
            out.append(f"  * {r['config']}: {r['time_us']:.0f} us, {'MET' if ok else 'MISSED'}"
                       + ("" if ok else f" by {r['time_us'] - bp['time_us']:.0f} us "
                          f"({r['time_us'] / bp['time_us']:.2f}x)"))
    return out


def plot(results, path, n, rate):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("# no matplotlib: plot skipped")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    for c in dict.fromkeys(r["config"] for r in results):
        rs = sorted((r for r in results if r["config"] == c), key=lambda r: r["size"])
        style = "-o" if rs[0]["family"] == "tributary" else "--s"
        ax1.plot([r["size"] for r in rs], [r["busbw"] for r in rs], style, ms=3, label=c)
        ax2.plot([r["size"] for r in rs], [r["time_us"] / 1e3 for r in rs], style, ms=3, label=c)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("busbw (GB/s)")
    ax2.set_ylabel("time (ms)")
    ax2.set_yscale("log")
    ax1.axhline(rate * 1e6 / 8 * TCP_EFFICIENCY / 1e9, color="gray", lw=0.8, ls=":")
    ax1.set_title(f"all-reduce, {n} workers, {rate} Mbit/s (tc tbf)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def update_benchmarks_md(md):
    path = os.path.join(ROOT, "BENCHMARKS.md")
    begin, end = "<!-- suite results begin -->", "<!-- suite results end -->"
    text = open(path).read() if os.path.exists(path) else f"# Benchmarks\n\n{begin}\n{end}\n"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(path, "w") as f:
        f.write(f"{head}{begin}\nLatest run: {stamp}.\n\n{md}{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
