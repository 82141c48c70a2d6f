#!/usr/bin/python3
"""The emulated-cluster benchmark suite: Tributary against Gloo and Open MPI on shaped namespaces.

One command builds the peers, brings up an emulated cluster (scripts/emulated_cluster.sh), runs
every configuration on it in one run, and writes a markdown table, a CSV and a PNG plot:

  bench/suite/run.py                 # 4 workers + 4 spare hosts at 500 Mbit/s, 4 KiB..256 MiB
  bench/suite/run.py --quick         # 2 workers + 1 spare at 1 Gbit/s, 4..256 KiB, seconds

Configurations: Tributary push/pull with at most k = 0, 1, 2, 4 spare summation hosts, Tributary
ring and halving-doubling, Gloo ring and halving-doubling, Open MPI default and forced ring.
Times are rank 0's mean per all-reduce, as nccl-tests and `tributary bench-rank` report them;
every element is checked after every timed iteration. Every band of the sweep and every
workload runs --repeats times, round-robin across the configurations; the report gives the
median and its spread, next to the model (DESIGN.md §1.1) and the plain-TCP ceiling of the same
traffic pattern, measured in the same run (see BENCHMARKS.md).

Exit codes: 0 done (targets missed are reported, not failures), 1 an error or wrong results,
77 skipped (not root, or network namespaces cannot be created here).
"""
import argparse
import bisect
import csv
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(ROOT, "scripts", "emulated_cluster.sh")
SKIP = 77
DEFAULT_MTU = 9000


def tcp_efficiency(mtu):
    """TCP payload through tbf per unit of shaped rate: (MTU - 52) / (MTU + 14).

    52 = IPv4 + TCP with timestamps, 14 = Ethernet; 0.9927 at MTU 9000, 0.9564 at 1500."""
    return (mtu - 52) / (mtu + 14)


TCP_EFFICIENCY = tcp_efficiency(DEFAULT_MTU)
MIB = 1 << 20
# DDP's default bucket (bucket_cap_mb=25), the peers' --bucket-bytes default (peer_common.h).
DDP_BUCKET_BYTES = 25 * MIB
# The label suffix of a Tributary configuration whose workload runs in DDP_BUCKET_BYTES buckets.
BUCKETS_SUFFIX = " DDP buckets"
# The cluster's names and subnet (scripts/emulated_cluster.sh TRIB_EMU_NAME / TRIB_EMU_NET); the
# quick mode uses its own so that a CI run cannot tear down a full run's cluster.
NS, SUBNET = "trib-h", "198.18.0"
# Debian's interpreter, where python3-torch and python3-torchvision live (python3 on PATH may be
# another one).
TORCH_PYTHON = "/usr/bin/python3"
# The suite's algorithm names -> `tributary create-job --algorithm`.
CLI_ALGORITHM = {"push-pull": "push-pull", "ring": "ring", "hd": "halving-doubling",
                 "rd": "recursive-doubling", "auto": "auto"}


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
        r = run([compiler, "-O2", "-std=c++17", "-I", HERE, "-I", ROOT,
                 os.path.join(HERE, exe + ".cc"), "-o", out] + libs, check=False)
        if r.returncode != 0:
            log(f"# {name} peer did not compile, skipped:\n{r.stderr[-2000:]}")
            peers[name] = None
        else:
            peers[name] = out
    return peers


# ---------------------------------------------------------------------------------------------
# CPU use per host: a poller sums utime+stime of every process in each host's namespace.


def host_processes(host_of):
    """(host, pid) of every process whose network namespace is in `host_of` ({(st_dev, st_ino) of
    /run/netns/NAME: host}), matched by inode as `ip netns identify` does. (Running `ip netns
    pids` per host, 32 processes a second on 8 hosts, took 10 % of a core and stalled the 2-core
    machine every 0.25 s.) Also bench/suite/thread_cpu.py."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        host = host_of.get((st.st_dev, st.st_ino))
        if host is not None:
            yield host, entry.name


class CpuMeter:
    def __init__(self, hosts):
        self.hosts = hosts
        self.tick = os.sysconf("SC_CLK_TCK")
        self.seen = {}  # (host, pid, starttime) -> last cpu ticks
        self.base = {}
        # [(time.monotonic(), {host: CPU seconds since start()})], one entry per sample: what
        # between() interpolates.
        self.timeline = []
        self.stop_flag = threading.Event()
        self.thread = None

    def _sample(self):
        # One pass over /proc (host_processes).
        host_of = {}
        for h in self.hosts:
            try:
                st = os.stat(f"/run/netns/{NS}{h}")
                host_of[(st.st_dev, st.st_ino)] = h
            except OSError:
                pass
        out = {}
        for h, pid in host_processes(host_of):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
                out[(h, pid, fields[19])] = ticks
            except (OSError, IndexError, ValueError):
                pass
        return out

    def _used(self):
        """{host: CPU seconds since start()} of every process seen so far."""
        use = {h: 0.0 for h in self.hosts}
        for key, ticks in self.seen.items():
            use[key[0]] += (ticks - self.base.get(key, 0)) / self.tick
        return use

    def _record(self):
        self.seen.update(self._sample())
        self.timeline.append((time.monotonic(), self._used()))

    def _loop(self):
        while not self.stop_flag.wait(0.25):
            self._record()

    def between(self, t0, t1):
        """{host: CPU seconds in [t0, t1]} (time.monotonic() times), interpolated between the
        samples around each end; None unless the last start()..stop() covers the window."""
        tl = self.timeline
        if len(tl) < 2 or not tl[0][0] <= t0 < t1 <= tl[-1][0]:
            return None
        times = [x[0] for x in tl]

        def at(t):
            i = bisect.bisect_left(times, t)
            if tl[i][0] == t or i == 0:
                return tl[i][1]
            (ta, a), (tb, b) = tl[i - 1], tl[i]
            f = (t - ta) / (tb - ta)
            return {h: a[h] + f * (b[h] - a[h]) for h in self.hosts}

        a, b = at(t0), at(t1)
        return {h: b[h] - a[h] for h in self.hosts}

    def start(self):
        self.base = self._sample()
        self.seen = dict(self.base)
        self.t0 = time.monotonic()
        self.timeline = [(self.t0, {h: 0.0 for h in self.hosts})]
        self.stop_flag.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self):
        """Returns {host: CPU use in % of one core over the window}."""
        self.stop_flag.set()
        self.thread.join()
        self._record()
        wall = max(self.timeline[-1][0] - self.t0, 1e-6)
        return {h: 100.0 * s / wall for h, s in self.timeline[-1][1].items()}


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


class Band(NamedTuple):
    """One process launch of the size sweep: these sizes, this many timed iterations each."""
    sizes: str  # comma list of bytes, as bench-rank and the peers take it
    iters: int


class Workload(NamedTuple):
    """One process launch of a model workload (the gradient list written by write_workload)."""
    name: str
    path: str
    iters: int
    warmup: int
    bytes: int


class Suite:
    """Runs one piece (a Band or a Workload) of one configuration on the emulated cluster.

    Every runner (tributary, gloo, mpi) takes the piece and returns rank 0's result: {size: row}
    for a Band, the WCSV dict for a Workload (tributary: with the spares its plan used)."""

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
        """The sweep's Bands: more iterations up to --small-upto, fewer from --large-from."""
        sizes = parse_sizes(self.args.sizes)
        large = parse_size(self.args.large_from)
        tiny_max = parse_size(self.args.small_upto)
        tiny = [s for s in sizes if s <= tiny_max and s < large]
        small = [s for s in sizes if tiny_max < s < large]
        big = [s for s in sizes if s >= large]
        out = []
        if tiny:
            out.append(Band(",".join(map(str, tiny)), self.args.small_iters))
        if small:
            out.append(Band(",".join(map(str, small)), self.args.iters))
        if big:
            out.append(Band(",".join(map(str, big)), self.args.large_iters))
        return out

    def what(self, piece, peer):
        """The arguments that say what to run, shared by bench-rank and the peers (which also
        take --large-iters: the bands already chose the iteration count)."""
        if isinstance(piece, Workload):
            return ["--tensors", piece.path, "--workload-name", piece.name, "--iters",
                    str(piece.iters), "--warmup", str(piece.warmup)]
        return (["--sizes", piece.sizes, "--iters", str(piece.iters)] +
                (["--large-iters", str(piece.iters)] if peer else []) +
                ["--warmup", str(self.args.warmup)])

    def extra_bench_rank_args(self, algorithm, k, piece, buckets=False):
        """Arguments appended to every `tributary bench-rank` of a Tributary configuration: a
        workload's DDP buckets (`buckets`), then the options of Tributary's side only
        (--bench-rank-arg on the command line)."""
        del algorithm, k  # the same for every configuration today
        extra = (["--bucket-bytes", str(DDP_BUCKET_BYTES)]
                 if buckets and isinstance(piece, Workload) else [])
        return extra + list(self.args.bench_rank_arg)

    def cli(self):
        """`tributary` against the suite's controller."""
        return [os.path.join(self.bin, "tributary"), "--controller", self.controller,
                "--rpc-timeout-ms", "30000"]

    def create_job(self, job, algorithm, k, model_bytes, fixed_partition=False, fusion=True):
        """Creates a Tributary job over the workers; returns its JSON (plan included).
        fixed_partition: no online partition tuning (the job keeps the planner's chunk size).
        fusion: tensor fusion as the planner sets it (False: --fusion-bytes 0)."""
        workers = ",".join(f"h{i}" for i in range(self.n))
        r = run(self.cli() + ["create-job", job, "--workers", workers, "--procs-per-node", "1",
                              "--spares", str(k), "--algorithm", CLI_ALGORITHM[algorithm],
                              "--model-bytes", str(model_bytes), "--timeout-ms", "300000",
                              "--partition-bytes", str(self.args.partition_bytes),
                              "--credit-bytes", str(self.args.credit_bytes), "--json"] +
                (["--fixed-partition"] if fixed_partition else []) +
                (["--fusion-bytes", "0"] if not fusion else
                 ["--fusion-bytes", str(self.args.fusion_bytes)] if self.args.fusion_bytes
                 else []) +
                (["--fusion-cycle-us", str(self.args.fusion_cycle_us)]
                 if fusion and self.args.fusion_cycle_us else []),
                check=False)
        if r.returncode != 0:
            raise RuntimeError(f"create job {job}: {r.stderr.strip()}")
        # Every plan the run used, one JSON object a line: servers, shares, partition, credit.
        with open(os.path.join(self.args.out_dir, "plans.jsonl"), "a") as f:
            f.write(json.dumps(json.loads(r.stdout)) + "\n")
        return r.stdout

    def tributary(self, algorithm, k, piece, fixed_partition=False, fusion=True, buckets=False):
        """(result, spares the plan used) of `tributary bench-rank` on every worker. buckets: a
        workload's tensors go in DDP-style buckets of DDP_BUCKET_BYTES, one all-reduce each, as
        the peers run them (default: each tensor on its own, fused by the agents)."""
        self.counter += 1
        job = f"suite-{algorithm}-{k}-{self.counter}"
        largest = (piece.bytes if isinstance(piece, Workload) else
                   max(int(s) for s in piece.sizes.split(",")))
        spares_used = spares_in_plan(self.create_job(job, algorithm, k, largest,
                                                     fixed_partition, fusion))
        what = self.what(piece, peer=False)
        extra = self.extra_bench_rank_args(algorithm, k, piece, buckets)
        procs, logs = [], []
        for i in range(self.n):
            path = os.path.join(self.work, f"{job}-{i}.out")
            logs.append(path)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{NS}{i}", "env", "UCX_TLS=tcp",
                 "UCX_NET_DEVICES=eth0", os.path.join(self.bin, "tributary"), "bench-rank",
                 "--agent", f"unix:{self.args.run_dir}/sock/h{i}.sock", "--job", job] +
                what + ["--csv", "--log-level", "warn", "--op-timeout-ms", "300000"] + extra,
                stdout=open(path, "w"), stderr=subprocess.STDOUT))
        codes = wait_all(procs, self.args.timeout)
        run(self.cli() + ["delete-job", job], check=False)
        if any(codes):
            raise RuntimeError(f"{job}: exit codes {codes}; rank 0 says:\n" +
                               open(logs[0]).read()[-2000:])
        return parse_result(open(logs[0]).read(), piece), spares_used

    def torch_iteration(self, k, overlap=False, ddp=False, layer_priorities=False):
        """(rank 0's TORCHITER dict, spares used) of torch_iteration.py on every worker host:
        with a Tributary job of at most k spares (--torch-algorithm), tributary.torch's
        DistributedOptimizer (`overlap`: with --overlap-forward; `layer_priorities`: with
        --layer-priorities) or (`ddp`) DDP over the "tributary" backend; DDP over Gloo (k
        None)."""
        self.counter += 1
        job = f"suite-torch-{k}-{self.counter}"
        spares_used = 0
        common = [os.path.join(HERE, "torch_iteration.py"), "--iters",
                  str(self.args.torch_iters), "--model", self.args.torch_iterations]
        if k is not None:
            spares_used = spares_in_plan(self.create_job(job, self.args.torch_algorithm, k,
                                                         100 * MIB))
        procs, logs = [], []
        for i in range(self.n):
            path = os.path.join(self.work, f"{job}-{i}.out")
            logs.append(path)
            env = ["UCX_TLS=tcp", "UCX_NET_DEVICES=eth0",
                   f"PYTHONPATH={os.path.join(os.path.dirname(self.bin), 'python')}"]
            rendezvous = ["--rank", str(i), "--world", str(self.n),
                          "--master", f"{SUBNET}.1:{29500 + self.counter % 1000}"]
            if k is not None:
                env += [f"TRIBUTARY_AGENT_ADDRESS=unix:{self.args.run_dir}/sock/h{i}.sock",
                        f"TRIBUTARY_JOB={job}", "TRIBUTARY_LOCAL_RANK=0",
                        "TRIBUTARY_LOCAL_SIZE=1"]
                mode = (["--mode", "ddp-tributary"] + rendezvous if ddp else
                        ["--mode", "tributary"] + (["--overlap-forward"] if overlap else []) +
                        (["--layer-priorities"] if layer_priorities else []))
            else:
                mode = ["--mode", "ddp-gloo"] + rendezvous + ["--ifname", "eth0"]
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{NS}{i}", "env"] + env + [TORCH_PYTHON] + common +
                mode, stdout=open(path, "w"), stderr=subprocess.STDOUT))
        codes = wait_all(procs, self.args.timeout)
        if k is not None:
            run(self.cli() + ["delete-job", job], check=False)
        if any(codes):
            raise RuntimeError(f"{job}: exit codes {codes}; rank 0 says:\n" +
                               open(logs[0]).read()[-2000:])
        return parse_torch_line(open(logs[0]).read()), spares_used

    def gloo(self, algorithm, piece):
        self.counter += 1
        store = tempfile.mkdtemp(prefix="gloo-store-", dir=self.work)
        what = self.what(piece, peer=True)
        procs, logs = [], []
        for i in range(self.n):
            path = os.path.join(self.work, f"gloo-{algorithm}-{i}-{self.counter}.out")
            logs.append(path)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{NS}{i}", self.peers["gloo"], "--rank", str(i),
                 "--size", str(self.n), "--store-dir", store, "--hostname",
                 f"{SUBNET}.{i + 1}", "--algorithm", algorithm] + what,
                stdout=open(path, "w"), stderr=subprocess.STDOUT))
        codes = wait_all(procs, self.args.timeout)
        if any(codes):
            raise RuntimeError(f"gloo {algorithm}: exit codes {codes}:\n" +
                               open(logs[0]).read()[-2000:])
        return parse_result(open(logs[0]).read(), piece)

    def mpi(self, algorithm, piece):
        forced = []
        if algorithm == "ring":
            forced = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca",
                      "coll_tuned_allreduce_algorithm", "4"]
        cmd = (["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(self.n),
                "--host", ",".join(f"{NS}{i}" for i in range(self.n)),
                "--mca", "plm_rsh_agent", os.path.join(HERE, "netns_rsh.sh"),
                "--mca", "oob_tcp_if_include", f"{SUBNET}.0/24",
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", f"{SUBNET}.0/24",
                "--mca", "mpi_yield_when_idle", "1"] + forced +
               [self.peers["mpi"], "--algorithm", algorithm] + self.what(piece, peer=True))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.timeout,
                           env=dict(os.environ, OMPI_MCA_plm_rsh_no_tree_spawn="1"))
        if r.returncode != 0:
            raise RuntimeError(f"mpi {algorithm}: exit {r.returncode}:\n" +
                               (r.stdout + r.stderr)[-2000:])
        return parse_result(r.stdout, piece)

    # -- the plain-TCP ceiling ------------------------------------------------------------------

    def plan_servers(self, k):
        """The summation servers {host index: share} of a push/pull plan with at most k spares,
        from a job created and deleted at once (the planner is deterministic)."""
        self.counter += 1
        job = f"suite-ceiling-{k}-{self.counter}"
        try:
            text = self.create_job(job, "push-pull", k, 64 * MIB)
        finally:
            run(self.cli() + ["delete-job", job], check=False)
        return servers_in_plan(text)

    def probe(self, flows, host_bytes, congestion=None):
        """probe_tcp between the hosts' namespaces."""
        return probe_tcp(flows, host_bytes, lambda h: ["ip", "netns", "exec", f"{NS}{h}"],
                         lambda h: f"{SUBNET}.{h + 1}", self.args.ceiling_streams,
                         self.args.timeout, congestion)


def probe_tcp(flows, host_bytes, launch, address, streams=1, timeout=120, congestion=None):
    """Plain TCP between hosts: every flow (src, dst, weight) at once, scaled so that the busiest
    host moves host_bytes (its larger direction), each flow over `streams` connections. One
    tcp_endpoint process per host, started as launch(host) + [python, run.py, ...] and bound to
    address(host); `congestion` names the senders' TCP congestion control (None: the host's
    default). Returns the busiest host's rate, bytes/s: its bytes / (start .. last byte received
    anywhere)."""
    unit = bottleneck_unit(flows)
    scaled = [(src, dst, int(w / unit * host_bytes)) for src, dst, w in flows]
    streams = max(1, streams)
    hosts = sorted({h for f in flows for h in f[:2]})
    procs = {}
    try:
        for h in hosts:
            procs[h] = subprocess.Popen(
                launch(h) + [sys.executable, os.path.abspath(__file__), "--tcp-endpoint",
                             address(h), "--timeout", str(timeout)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ports = {h: endpoint_line(p, "port")["port"] for h, p in procs.items()}
        for h, p in procs.items():
            out = []
            for src, dst, total in scaled:
                if src == h:
                    out += [[address(dst), ports[dst], total // streams +
                             (1 if s < total % streams else 0)] for s in range(streams)]
            incoming = streams * sum(1 for f in scaled if f[1] == h)
            p.stdin.write(json.dumps({"incoming": incoming, "outgoing": out,
                                      "congestion": congestion}) + "\n")
            p.stdin.flush()
        for p in procs.values():
            endpoint_line(p, "ready")
        t0 = time.monotonic()
        for p in procs.values():
            p.stdin.write("go\n")
            p.stdin.flush()
        done = [endpoint_line(p, "recv_end") for p in procs.values()]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            for pipe in (p.stdin, p.stdout):
                try:
                    pipe.close()
                except OSError:  # the endpoint is gone: nothing left to flush
                    pass
    want = sum(b for _, _, b in scaled)
    sent, received = sum(d["sent"] for d in done), sum(d["received"] for d in done)
    if sent != want or received != want:
        raise RuntimeError(f"tcp probe: {want} bytes to move, {sent} sent, {received} received")
    elapsed = max(d["recv_end"] for d in done) - t0
    return bottleneck_unit(scaled) / max(elapsed, 1e-9)


def endpoint_line(proc, key):
    """The next JSON line of a probe endpoint, which must hold `key` (else its error)."""
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"tcp probe endpoint exited ({proc.wait()}) before '{key}'")
    msg = json.loads(line)
    if key not in msg:
        raise RuntimeError(f"tcp probe endpoint: {msg.get('error', line.strip())}")
    return msg


# ---------------------------------------------------------------------------------------------
# Theory, table, targets, plot


def theory_seconds(size, n, k, rate_mbit):
    """DESIGN.md §1.1 with B the TCP payload rate through tbf; k = 0 is ring all-reduce."""
    b = rate_mbit * 1e6 / 8 * TCP_EFFICIENCY
    k = min(k, n)
    d = n * n + k * n - 2 * k
    return 2 * n * (n - 1) * size / (d * b)


# ---------------------------------------------------------------------------------------------
# Model-shaped workloads: the gradient tensors of one training iteration, from the public
# architectures, in the order backward produces them (last layer first).


def resnet50_tensors():
    """torchvision resnet50: 161 tensors, 25,557,032 parameters."""
    fwd = [("conv1.weight", 64 * 3 * 7 * 7), ("bn1.weight", 64), ("bn1.bias", 64)]
    inplanes = 64
    for layer, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), 1):
        for b in range(blocks):
            p = f"layer{layer}.{b}."
            fwd += [(p + "conv1.weight", planes * inplanes), (p + "bn1.weight", planes),
                    (p + "bn1.bias", planes), (p + "conv2.weight", planes * planes * 9),
                    (p + "bn2.weight", planes), (p + "bn2.bias", planes),
                    (p + "conv3.weight", planes * 4 * planes), (p + "bn3.weight", planes * 4),
                    (p + "bn3.bias", planes * 4)]
            if b == 0:
                fwd += [(p + "downsample.0.weight", planes * 4 * inplanes),
                        (p + "downsample.1.weight", planes * 4),
                        (p + "downsample.1.bias", planes * 4)]
            inplanes = planes * 4
    fwd += [("fc.weight", 1000 * 2048), ("fc.bias", 1000)]
    return fwd[::-1]


def bert_large_tensors():
    """BERT-large (uncased: 24 layers, hidden 1024, FFN 4096, vocabulary 30522, 512 positions)
    with its pooler: 391 tensors, 335,141,888 parameters."""
    h, ffn = 1024, 4096
    fwd = [("embeddings.word_embeddings.weight", 30522 * h),
           ("embeddings.position_embeddings.weight", 512 * h),
           ("embeddings.token_type_embeddings.weight", 2 * h),
           ("embeddings.LayerNorm.weight", h), ("embeddings.LayerNorm.bias", h)]
    for i in range(24):
        p = f"encoder.layer.{i}."
        for m in ("query", "key", "value"):
            fwd += [(p + f"attention.self.{m}.weight", h * h), (p + f"attention.self.{m}.bias", h)]
        fwd += [(p + "attention.output.dense.weight", h * h),
                (p + "attention.output.dense.bias", h),
                (p + "attention.output.LayerNorm.weight", h),
                (p + "attention.output.LayerNorm.bias", h),
                (p + "intermediate.dense.weight", ffn * h), (p + "intermediate.dense.bias", ffn),
                (p + "output.dense.weight", h * ffn), (p + "output.dense.bias", h),
                (p + "output.LayerNorm.weight", h), (p + "output.LayerNorm.bias", h)]
    fwd += [("pooler.dense.weight", h * h), ("pooler.dense.bias", h)]
    return fwd[::-1]


def bert_large_1d_tensors():
    """The 1-D tensors of BERT-large (biases and LayerNorm parameters: 243 tensors of 4-16 KiB,
    1.3 MB): the small-tensor regime where per-operation costs, not bandwidth, decide, and where
    tensor fusion matters (the peers' DDP buckets fuse them into one all-reduce)."""
    return [(n, c) for n, c in bert_large_tensors() if not n.endswith(".weight") or
            "LayerNorm" in n]


# name -> (tensors, timed iterations, warm-up iterations): BERT-large is 1.3 GB of float32, ~30 s
# per ring all-reduce at 500 Mbit/s, so it runs once.
WORKLOADS = {"resnet50": (resnet50_tensors, 3, 1), "bert-large": (bert_large_tensors, 1, 0),
             "bert-large-1d": (bert_large_1d_tensors, 10, 2)}


def parse_workload_iters(ap, items):
    """--workload-iters NAME=TIMED[:WARMUP] -> {name: (timed, warm-up)}; errors name the bad
    item. A missing WARMUP keeps the workload's default."""
    out = {}
    for item in items:
        name, sep, counts = item.partition("=")
        if not sep or name not in WORKLOADS:
            ap.error(f"--workload-iters {item!r}: expected NAME=TIMED[:WARMUP] with NAME one of "
                     f"{', '.join(WORKLOADS)}")
        timed, _, warmup = counts.partition(":")
        try:
            timed = int(timed)
            warmup = int(warmup) if warmup else WORKLOADS[name][2]
        except ValueError:
            ap.error(f"--workload-iters {item!r}: TIMED and WARMUP must be integers")
        if timed < 1 or warmup < 0:
            ap.error(f"--workload-iters {item!r}: at least 1 timed iteration, warm-up >= 0")
        out[name] = (timed, warmup)
    return out


def write_workload(name, folder):
    path = os.path.join(folder, f"{name}.tensors")
    tensors = WORKLOADS[name][0]()
    with open(path, "w") as f:
        f.write(f"# {name}: {len(tensors)} gradient tensors, "
                f"{sum(c for _, c in tensors)} float32 parameters, backward order\n")
        for n, c in tensors:
            f.write(f"{n} {c}\n")
    return path, len(tensors), 4 * sum(c for _, c in tensors)


def run_measured(meter, runner, what, *args):
    """Runs one piece of a configuration under the CPU meter: (result, spares used, CPU % per
    host, wall seconds), or None when it raised (the error is logged; the suite goes on)."""
    meter.start()
    t0 = time.monotonic()
    try:
        got = runner(*args)
    except Exception as e:  # noqa: BLE001 - report and go on with the others
        meter.stop()
        log(f"error: {what}: {e}")
        return None
    cpu = meter.stop()
    spares_used = 0
    if isinstance(got, tuple):
        got, spares_used = got
    return got, spares_used, cpu, time.monotonic() - t0


def spares_in_plan(job_json):
    """Spare hosts serving a job: the servers in `tributary create-job --json`'s plan that are
    not workers."""
    servers = json.loads(job_json).get("plan", {}).get("servers", [])
    return sum(1 for s in servers if not s.get("is_worker", False))


def timed_window(text):
    """(from, to) of rank 0's WTIMED line: its timed iterations' window on the steady clock
    (time.monotonic()'s), or None."""
    for line in text.splitlines():
        c = line.split(",")
        if line.startswith("WTIMED,") and len(c) == 3:
            return float(c[1]), float(c[2])
    return None


def timed_worker_cpu_ms(meter, window, iterations, n):
    """The worker hosts' (the first n) mean CPU time per iteration in the timed iterations'
    window, in ms; None without a window the meter covers."""
    cpu = meter.between(*window) if window else None
    return None if cpu is None else 1e3 * statistics.mean(list(cpu.values())[:n]) / iterations


def parse_wcsv(text):
    """Rank 0's WCSV line, with the timed iterations' window ("timed", see timed_window) and
    each iteration's time ("iterations_ms") when those lines came too."""
    row, iterations = None, None
    for line in text.splitlines():
        c = line.split(",")
        if line.startswith("WCSV,") and len(c) == 6:
            row = {"tensors": int(c[2]), "bytes": int(c[3]), "time_us": float(c[4]),
                   "wrong": int(c[5])}
        elif line.startswith("# ") and " iterations (ms, " in line:
            iterations = [float(x) for x in line.split(":", 1)[1].split()]
    if row is None:
        return None
    if (timed := timed_window(text)) is not None:
        row["timed"] = timed
    if iterations is not None:
        row["iterations_ms"] = iterations
    return row


def parse_result(text, piece):
    """Rank 0's result for one piece: {size: row} of a Band, the WCSV dict of a Workload."""
    return parse_wcsv(text) if isinstance(piece, Workload) else parse_csv_lines(text)


def servers_in_plan(job_json):
    """{host index: share} of the summation servers in `tributary create-job --json`'s plan that
    own a part of every tensor (node ids are hK, as scripts/emulated_cluster.sh names them)."""
    servers = json.loads(job_json).get("plan", {}).get("servers", [])
    return {int(s["node_id"].lstrip("h")): float(s.get("share", 0.0)) for s in servers
            if float(s.get("share", 0.0)) > 0}


# ---------------------------------------------------------------------------------------------
# Repeats: the order of the runs and what is reported of them.


def interleave(units, repeats):
    """The runs, round-robin: every unit once (in order), then every unit again, ... so that slow
    drift of the machine hits every configuration alike. Returns [(repeat, unit)]."""
    return [(rep, u) for rep in range(repeats) for u in units]


def time_stats(times):
    """Median, min, max and (max - min) / median in % of the repeats' times (us)."""
    med = statistics.median(times)
    lo, hi = min(times), max(times)
    return {"time_us": med, "time_min_us": lo, "time_max_us": hi,
            "spread_pct": 100.0 * (hi - lo) / med if med > 0 else 0.0, "repeats": len(times),
            "times_us": list(times)}


def mean_cpu(samples):
    """CPU % per host over several runs of one configuration, weighted by each run's wall time
    (the CPU time of all its runs over their total wall time). samples: [(cpu dict, wall s)]."""
    wall = sum(w for _, w in samples)
    hosts = list(dict.fromkeys(h for cpu, _ in samples for h in cpu))
    if wall <= 0:
        return {h: statistics.mean(cpu.get(h, 0.0) for cpu, _ in samples) for h in hosts}
    return {h: sum(cpu.get(h, 0.0) * w for cpu, w in samples) / wall for h in hosts}


def busbw_factor(n):
    return 2 * (n - 1) / n


def aggregate_sweep(samples, cpu_samples, n):
    """One row per (config, size) from the repeats' rows: the median time (algbw and busbw from
    it), its spread, the wrong elements of every repeat, CPU over every run of the config.

    samples: rows of single runs (config, family, k, spares_used, size, time_us, wrong, ...);
    cpu_samples: {config: [(cpu dict, wall s)]}. Configs keep their first-seen order."""
    groups = {}
    for r in samples:
        groups.setdefault((r["config"], r["size"]), []).append(r)
    out = []
    for (config, size), rs in groups.items():
        row = dict(config=config, family=rs[0]["family"], k=rs[0]["k"],
                   spares_used=rs[-1]["spares_used"], size=size,
                   wrong=sum(r["wrong"] for r in rs),
                   cpu=mean_cpu(cpu_samples.get(config, [])) or rs[0].get("cpu", {}),
                   **time_stats([r["time_us"] for r in rs]))
        row["algbw"] = size / row["time_us"] / 1e3 if row["time_us"] > 0 else 0.0
        row["busbw"] = row["algbw"] * busbw_factor(n)
        out.append(row)
    return out


def median_or_none(values):
    """The median of the values that are not None; None when all are."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def aggregate_workloads(samples):
    """One row per (workload, config) from the repeats' rows, as aggregate_sweep (each run's CPU
    is its own: the workload's runs are metered one by one)."""
    groups = {}
    for r in samples:
        groups.setdefault((r["workload"], r["config"]), []).append(r)
    out = []
    for (workload, config), rs in groups.items():
        out.append(dict(config=config, family=rs[0]["family"], k=rs[0]["k"],
                        spares_used=rs[-1]["spares_used"], workload=workload,
                        tensors=rs[0]["tensors"], bytes=rs[0]["bytes"],
                        wrong=sum(r["wrong"] for r in rs),
                        cpu=mean_cpu([(r["cpu"], r.get("wall_s", 1.0)) for r in rs]),
                        timed_cpu_ms=median_or_none([r.get("timed_cpu_ms") for r in rs]),
                        **time_stats([r["time_us"] for r in rs])))
    return out


# ---------------------------------------------------------------------------------------------
# The plain-TCP ceiling: each configuration's traffic pattern, measured with plain sockets.
#
# A pattern is a list of flows (src host, dst host, bytes per byte of the all-reduced tensor),
# all at once. Its unit is the bytes the busiest host moves per tensor byte (the larger of what
# it sends and what it receives); the probe measures that host's rate R; the time at the ceiling
# of an all-reduce of M bytes is unit x M / R.


def ring_flows(n):
    """Ring all-reduce: each host streams 2(n-1)/n of the tensor to its successor."""
    return [(i, (i + 1) % n, busbw_factor(n)) for i in range(n)] if n > 1 else []


def hd_flows(n):
    """Halving-doubling: pairs exchanging both ways (one step's pattern; every step has the same
    load per host), 2(n-1)/n of the tensor per host over the steps."""
    return [(i, i ^ 1, busbw_factor(n)) for i in range(n) if (i ^ 1) < n]


def rd_flows(n):
    """Recursive doubling: pairs exchanging the whole tensor both ways (one step's pattern; every
    step has the same load per host), log2(p) tensors per host over the steps (+ 2 for the fold
    when n is not a power of two, p = 2^floor(log2 n))."""
    p = 1 << (n.bit_length() - 1)
    unit = (p.bit_length() - 1) + (2 if p != n else 0)
    return [(i, i ^ 1, unit) for i in range(n) if (i ^ 1) < n]


def push_pull_flows(n, servers):
    """Push/pull: every worker (hosts 0..n-1) <-> every summation server of the plan other than
    itself, both ways at once, share x tensor bytes each way. servers: {host: share}."""
    flows = []
    for w in range(n):
        for s, share in sorted(servers.items()):
            if s != w and share > 0:
                flows += [(w, s, share), (s, w, share)]
    return flows


def bottleneck_unit(flows):
    """The most bytes any host moves in one direction, summed over flows."""
    out, inn = {}, {}
    for src, dst, b in flows:
        out[src] = out.get(src, 0) + b
        inn[dst] = inn.get(dst, 0) + b
    return max(list(out.values()) + list(inn.values()), default=0)


def uses_spares(config):
    """Whether a configuration's job may use spare summation hosts (push/pull, auto)."""
    return config.startswith(("tributary push/pull", "tributary auto"))


def pattern_for(config, spares_used):
    """The ceiling pattern whose traffic a configuration moves: push/pull by the spares its plan
    used, ring (Tributary's, Gloo's, Open MPI's ring, and Open MPI's default, whose choice varies
    with the size: it moves at least a ring's bytes), halving-doubling, recursive doubling."""
    if config.startswith("tributary push/pull") or (config.startswith("tributary auto") and
                                                     spares_used > 0):
        return f"push/pull {spares_used} spares"
    if "halving-doubling" in config:
        return "halving-doubling"
    if "recursive doubling" in config:
        return "recursive doubling"
    return "ring"


def ceiling_summary(name, flows, rates):
    """A ceiling pattern's record: its unit, flows, the probes' rates (bytes/s per host). `rates`
    is a list (the host's congestion control) or {congestion control: list}; the ceiling is the
    congestion control with the highest median ("congestion"), whose probes are "rates"."""
    by = {cc: list(r) for cc, r in rates.items() if r} if isinstance(rates, dict) else \
        {SYSTEM_CONGESTION: list(rates)}
    best = max(by, key=lambda cc: statistics.median(by[cc])) if by else SYSTEM_CONGESTION
    chosen = by.get(best, [])
    return {"pattern": name, "unit": bottleneck_unit(flows), "flows": len(flows),
            "rates": chosen, "rate": statistics.median(chosen) if chosen else 0.0,
            "congestion": best, "by_congestion": by}


def add_ceiling(r, ceilings, nbytes, rate_mbit):
    """Adds the ceiling columns to a row (or "-" where its pattern was not measured):
    ceiling_us = unit x bytes / R, efficiency_vs_ceiling = ceiling_us / median time, and the
    ceiling's rate per host relative to the model's B."""
    if r.get("ceiling_from_csv"):
        # A row of an earlier run (--merge, --from-results) keeps the ceiling of its own run.
        r["efficiency_vs_ceiling"] = r["ceiling_us"] / r["time_us"] if r["time_us"] > 0 else 0.0
        return
    c = ceilings.get(pattern_for(r["config"], r["spares_used"])) if ceilings else None
    if c is None or c["rate"] <= 0:
        r["ceiling_us"], r["efficiency_vs_ceiling"], r["ceiling_pattern"] = None, None, ""
        return
    r["ceiling_pattern"] = c["pattern"]
    r["ceiling_us"] = c["unit"] * nbytes / c["rate"] * 1e6
    r["efficiency_vs_ceiling"] = r["ceiling_us"] / r["time_us"] if r["time_us"] > 0 else 0.0
    r["ceiling_vs_model_rate"] = c["rate"] / model_rate(rate_mbit)


# The host's default congestion control in --ceiling-congestion and the ceiling's records.
SYSTEM_CONGESTION = "system"


def host_congestion_control():
    """net.ipv4.tcp_congestion_control of this host (namespaces made here inherit it)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def model_rate(rate_mbit):
    """B: the TCP payload rate through tbf, bytes/s."""
    return rate_mbit * 1e6 / 8 * TCP_EFFICIENCY


def tcp_endpoint(address, timeout):
    """One host's side of a plain-TCP probe, run inside the host's namespace by Suite.probe.

    Protocol on stdin/stdout, one JSON line each: prints {"port"} once listening on address;
    reads {"incoming": connections to accept, "outgoing": [[address, port, bytes]]}, connects
    and accepts them all, prints {"ready"}; on the line "go" sends every outgoing byte count
    (then shuts the connection down) and receives every incoming connection to its end; prints
    {"sent", "received", "recv_end": time.monotonic() of the last byte received}. Any error is
    printed as {"error"}; SIGALRM ends it after `timeout` seconds whatever happens."""
    signal.alarm(max(1, int(timeout)))
    try:
        lsock = socket.create_server((address, 0), backlog=512)
        print(json.dumps({"port": lsock.getsockname()[1]}), flush=True)
        plan = json.loads(sys.stdin.readline())
        lsock.settimeout(timeout)
        incoming = []
        acceptor = threading.Thread(
            target=lambda: incoming.extend(lsock.accept()[0] for _ in range(plan["incoming"])))
        acceptor.start()
        def connect(a, p):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if plan.get("congestion"):
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                                    plan["congestion"].encode())
                except OSError as e:
                    raise RuntimeError(f"TCP_CONGESTION {plan['congestion']}: {e}") from e
            sock.settimeout(timeout)
            sock.connect((a, p))
            return sock

        outgoing = [(connect(a, p), b) for a, p, b in plan["outgoing"]]
        acceptor.join()
        if len(incoming) != plan["incoming"]:
            raise RuntimeError(f"accepted {len(incoming)} of {plan['incoming']} connections")
        print(json.dumps({"ready": True}), flush=True)
        if sys.stdin.readline().strip() != "go":
            raise RuntimeError("expected 'go'")
        block = memoryview(bytearray(1 << 20))
        got = {"received": 0, "recv_end": time.monotonic(), "errors": []}
        lock = threading.Lock()

        def send(sock, nbytes):
            try:
                left = nbytes
                while left > 0:
                    sock.sendall(block[:min(left, len(block))])
                    left -= min(left, len(block))
                sock.shutdown(socket.SHUT_WR)
            except OSError as e:
                got["errors"].append(f"send: {e}")

        def receive(sock):
            buf, n, last = bytearray(1 << 20), 0, None
            try:
                sock.settimeout(timeout)
                while True:
                    k = sock.recv_into(buf)
                    if k == 0:
                        break
                    n, last = n + k, time.monotonic()
            except OSError as e:
                got["errors"].append(f"receive: {e}")
            with lock:
                got["received"] += n
                if last is not None:
                    got["recv_end"] = max(got["recv_end"], last)

        threads = ([threading.Thread(target=send, args=o) for o in outgoing] +
                   [threading.Thread(target=receive, args=(s,)) for s in incoming])
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if got["errors"]:
            raise RuntimeError("; ".join(got["errors"][:3]))
        print(json.dumps({"sent": sum(b for _, b in outgoing), "received": got["received"],
                          "recv_end": got["recv_end"]}), flush=True)
        return 0
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        print(json.dumps({"error": f"{address}: {e}"}), flush=True)
        return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 workers + 1 spare at 1 Gbit/s, 4K:256K, for CI (seconds)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--k", default="0,1,2,4", help="push/pull spare counts")
    ap.add_argument("--rate", type=int, default=500, help="NIC rate per host, Mbit/s")
    ap.add_argument("--mtu", type=int, default=DEFAULT_MTU,
                    help="the emulated NICs' MTU (scripts/emulated_cluster.sh TRIB_EMU_MTU)")
    ap.add_argument("--sizes", default="4K:256M")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations below --large-from")
    ap.add_argument("--large-iters", type=int, default=2, help="timed iterations from --large-from")
    ap.add_argument("--large-from", default="16M")
    ap.add_argument("--small-iters", type=int, default=200,
                    help="timed iterations up to --small-upto: a 4 KiB all-reduce takes about "
                         "0.5 ms, so 10 of them average a few milliseconds, which one stall of "
                         "the 2-core machine dominates (OSU's latency tests run thousands)")
    ap.add_argument("--small-upto", default="64K")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of every band and workload of every configuration, round-robin "
                         "across configurations; the median is reported (default 3, --quick 1)")
    ap.add_argument("--ceiling-probes", type=int, default=None,
                    help="plain-TCP probes of every traffic pattern, after the sweep and the "
                         "workloads (default 2, --quick 1; 0: no ceiling)")
    ap.add_argument("--ceiling-seconds", type=float, default=None,
                    help="a probe moves this many seconds of the shaped rate through the busiest "
                         "host (default 3, --quick 0.5)")
    ap.add_argument("--ceiling-streams", type=int, default=1,
                    help="TCP connections per flow of a probe")
    ap.add_argument("--ceiling-congestion", default="system,cubic",
                    help="the probes' TCP congestion controls, comma list (\"system\": the host's "
                         "default, which Gloo's, MPI's and by default the agents' sockets run; "
                         "cubic: the agents' --tcp-congestion cubic): every pattern is probed "
                         "with each, and its ceiling is the one with the highest median")
    ap.add_argument("--workloads", default="resnet50,bert-large",
                    help="model workloads to run after the sweep (comma list of resnet50, "
                         "bert-large, bert-large-1d; or none)")
    ap.add_argument("--workload-iters", action="append", default=[], metavar="NAME=TIMED[:WARMUP]",
                    help="a workload's timed and warm-up iterations per run instead of its "
                         "default (repeatable; e.g. bert-large=1:1 gives BERT-large the warm-up "
                         "that lets tensor fusion and the partition tuner see one iteration "
                         "before the timed one)")
    ap.add_argument("--torch-iterations", default="none", choices=["none", "resnet50"],
                    help="after the workloads: real PyTorch training iterations of this "
                         "torchvision model (CPU compute, random data) with "
                         "tributary.torch.DistributedOptimizer and with DDP over the "
                         "\"tributary\" backend at k = 0 and the largest --k, against DDP over "
                         "PyTorch's own Gloo backend")
    ap.add_argument("--torch-overlap-forward", action="store_true",
                    help="with --torch-iterations: one more configuration, tributary.torch at "
                         "the largest --k with DistributedOptimizer(overlap_forward=model) (each "
                         "layer's update applied as the next forward pass reaches it)")
    ap.add_argument("--torch-layer-priorities", action="store_true",
                    help="with --torch-iterations: one more configuration, tributary.torch at "
                    "the largest --k with DistributedOptimizer(priorities=True) (first layers "
                    "first; by default the optimizer sends in backward order unless it overlaps "
                    "the forward pass)")
    ap.add_argument("--torch-only", action="append", metavar="LABEL",
                    help="with --torch-iterations: run only the configuration of this label "
                    "(as the report names it, e.g. \"tributary.torch k=4\"; repeatable)")
    ap.add_argument("--torch-algorithm", default="auto", choices=sorted(CLI_ALGORITHM),
                    help="with --torch-iterations: the Tributary jobs' algorithm (auto: the "
                         "agent's choice per tensor, what a job gets by default; until session "
                         "35 push-pull)")
    ap.add_argument("--torch-iters", type=int, default=3,
                    help="timed PyTorch iterations per run (after two warm-up iterations)")
    ap.add_argument("--print-workload", default=None, choices=sorted(WORKLOADS),
                    help="print a workload's tensor list and totals, then exit")
    ap.add_argument("--partition-bytes", type=int, default=0,
                    help="Tributary jobs' partition size (0: the planner's choice)")
    ap.add_argument("--credit-bytes", type=int, default=0,
                    help="Tributary jobs' credit window (0: the planner's choice)")
    ap.add_argument("--fusion-bytes", type=int, default=0,
                    help="Tributary jobs' tensor fusion size (0: the planner's choice; the "
                         "-nofusion configs turn it off)")
    ap.add_argument("--fusion-cycle-us", type=int, default=0,
                    help="Tributary jobs' tensor fusion cycle, microseconds (0: automatic, the "
                         "median time of the first iteration's all-reduces within the agent's "
                         "bounds)")
    ap.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                    help="an argument appended to every tributary-agent of the cluster "
                         "(repeatable; e.g. --agent-arg=--trace --agent-arg=/tmp/trace-{node}.json)")
    ap.add_argument("--bench-rank-arg", action="append", default=[], metavar="ARG",
                    help="an argument appended to every `tributary bench-rank` (repeatable; "
                         "write --bench-rank-arg=--flag for one that starts with -)")
    ap.add_argument("--configs", default="all",
                    help="comma list of: pp,pp-fixed (push/pull without online partition tuning),"
                         "pp-nofusion,trib-auto-nofusion,trib-ring-nofusion (without tensor fusion),trib-ring,trib-hd,trib-rd (recursive doubling),trib-auto (the agent's "
                         "choice per tensor, k as --k),pp-buckets,trib-ring-buckets,"
                         "trib-auto-buckets (workloads only: the tensors in DDP's 25 MiB "
                         "buckets, one all-reduce each, as the peers run them),gloo-ring,gloo-hd,"
                         "mpi-default,mpi-ring")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    ap.add_argument("--run-dir", default="/tmp/trib-emu-suite")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process launch")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get missing packages")
    ap.add_argument("--update-benchmarks-md", action="store_true",
                    help="replace the results block of BENCHMARKS.md (default in full mode)")
    ap.add_argument("--from-results", default=None, metavar="DIR",
                    help="run nothing: rebuild the report from DIR's emulated_allreduce.csv, "
                         "emulated_workloads.csv and emulated_ceiling.csv (give the run's "
                         "--workers, --rate, --mtu, --k)")
    ap.add_argument("--merge", default=None,
                    help="a CSV of an earlier run: its rows of configs not run now are kept")
    ap.add_argument("--tcp-endpoint", default=None, help=argparse.SUPPRESS)  # Suite.probe's
    args = ap.parse_args()
    if args.tcp_endpoint:
        return tcp_endpoint(args.tcp_endpoint, args.timeout)
    argv = " ".join(sys.argv[1:])
    if args.print_workload:
        tensors = WORKLOADS[args.print_workload][0]()
        for n, c in tensors:
            print(f"{n} {c}")
        print(f"# {len(tensors)} tensors, {sum(c for _, c in tensors)} parameters")
        return 0
    global NS, SUBNET
    name, net = ("tribq", "1") if args.quick else ("trib", "0")
    os.environ["TRIB_EMU_NAME"], os.environ["TRIB_EMU_NET"] = name, net
    os.environ["TRIB_EMU_MTU"] = str(args.mtu)
    global TCP_EFFICIENCY
    TCP_EFFICIENCY = tcp_efficiency(args.mtu)
    NS, SUBNET = f"{name}-h", f"198.18.{net}"
    if args.quick:
        if args.run_dir == "/tmp/trib-emu-suite":
            args.run_dir = "/tmp/tribq-emu-suite"
        args.workers, args.k, args.rate = 2, "0,1", 1000
        args.sizes, args.iters, args.large_iters, args.warmup = "4K:256K", 3, 2, 1
        args.small_iters = 3
        args.no_install = True
        args.workloads = "none"
    for opt, full, quick in (("repeats", 3, 1), ("ceiling_probes", 2, 1),
                             ("ceiling_seconds", 3.0, 0.5)):
        if getattr(args, opt) is None:
            setattr(args, opt, quick if args.quick else full)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    args.workloads = [w for w in args.workloads.split(",") if w and w != "none"]
    for w in args.workloads:
        if w not in WORKLOADS:
            ap.error(f"--workloads: unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    args.workload_iters = parse_workload_iters(ap, args.workload_iters)
    args.k = [int(x) for x in args.k.split(",") if x != ""]
    if args.torch_only:
        try:
            torch_configs(args)
        except ValueError as e:
            ap.error(str(e))
    out = args.out or (os.path.join(ROOT, "build", "emulated-quick") if args.quick
                       else os.path.join(ROOT, "bench", "results"))
    # BENCHMARKS.md shows the full suite's results: only a run writing to bench/results updates it.
    update_md = args.update_benchmarks_md or (not args.quick and args.out is None)

    if args.from_results:
        os.makedirs(out, exist_ok=True)
        results = merge([], os.path.join(args.from_results, "emulated_allreduce.csv"))
        wresults = load_workloads(os.path.join(args.from_results, "emulated_workloads.csv"))
        ceilings = load_ceilings(os.path.join(args.from_results, "emulated_ceiling.csv"))
        report(results, args, out, argv, update_md, wresults, ceilings)
        return 0

    why = can_use_namespaces()
    if why:
        log(f"SKIP: emulated-cluster suite not run: {why}")
        return SKIP
    for exe in ("tributary", "tributary-agent", "tributary-controller"):
        if not os.access(os.path.join(args.bin_dir, exe), os.X_OK):
            log(f"error: {args.bin_dir}/{exe} is missing: build first (--bin-dir)")
            return 1
    ensure_packages(not args.no_install)
    os.makedirs(out, exist_ok=True)
    args.out_dir = out
    open(os.path.join(out, "plans.jsonl"), "w").close()
    work = tempfile.mkdtemp(prefix="trib-suite-")
    peers = build_peers(args.bin_dir, work)
    wanted = args.configs.split(",") if args.configs != "all" else [
        "pp", "trib-ring", "trib-hd", "trib-rd", "gloo-ring", "gloo-hd", "mpi-default",
        "mpi-ring"]
    if args.quick:
        wanted = [c for c in wanted if c not in ("gloo-hd", "mpi-ring")]

    suite = Suite(args, peers, args.bin_dir, work)
    nhosts = len(suite.hosts)
    env = dict(os.environ, TRIBUTARY_BIN_DIR=args.bin_dir)
    results, wresults, tresults, ceilings = [], [], [], {}
    failed = False

    def cleanup():
        subprocess.run([CLUSTER, "down"], env=env, capture_output=True)

    try:
        log(f"# emulated cluster: {nhosts} hosts at {args.rate} Mbit/s; {args.workers} workers; "
            f"{args.repeats} repeats")
        r = run([CLUSTER, "up", str(nhosts), str(args.rate)], env=env, check=False)
        if r.returncode != 0:
            log(f"SKIP: emulated cluster could not be created: {r.stderr.strip()}")
            cleanup()
            return SKIP
        shutil.rmtree(args.run_dir, ignore_errors=True)
        r = run([CLUSTER, "start-tributary", args.run_dir, "--sum-gbps", "4"] + args.agent_arg, env=env,
                check=False)
        if r.returncode != 0:
            raise RuntimeError("start-tributary failed: " + r.stderr + r.stdout)
        suite.controller = r.stdout.strip().splitlines()[-1].split("=", 1)[1]
        meter = CpuMeter(suite.hosts)
        configs = build_configs(suite, wanted, peers)
        patterns = ceiling_patterns(suite, wanted)
        rates = {p: {} for p in patterns}
        results, failed_sweep = run_sweep(suite, meter, configs)
        failed |= failed_sweep
        wresults, failed_workloads = run_workloads(suite, meter, configs, work)
        failed |= failed_workloads
        tresults, failed_torch = run_torch_iterations(suite, meter)
        failed |= failed_torch
        # The probes run last: their traffic shows in the spare hosts' measured load for a
        # while, and a job created right after one would get fewer spares from the planner.
        failed |= not measure_ceilings(suite, patterns, rates, args.ceiling_probes)
        ceilings = {p: ceiling_summary(p, flows, rates[p]) for p, flows in patterns.items()
                    if rates[p]}
    except Exception as e:  # noqa: BLE001
        log(f"error: {e}")
        failed = True
    finally:
        cleanup()

    if args.merge and os.path.exists(args.merge):
        results = merge(results, args.merge)
    if not results and not wresults and not tresults:
        log("error: no results")
        return 1
    report(results, args, out, argv, update_md, wresults, ceilings, tresults)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def build_configs(suite, wanted, peers):
    """[(label, family, k, runner(piece))] of the configurations to run, in report order."""
    args = suite.args
    configs = []
    if "pp" in wanted:
        configs += [(f"tributary push/pull k={k}", "tributary", k,
                     lambda p, k=k: suite.tributary("push-pull", k, p)) for k in args.k]
    if "pp-fixed" in wanted:  # the same without online partition tuning: its A/B
        configs += [(f"tributary push/pull k={k} fixed partition", "tributary", k,
                     lambda p, k=k: suite.tributary("push-pull", k, p, fixed_partition=True))
                    for k in args.k]
    if "pp-nofusion" in wanted:  # the same without tensor fusion: its A/B
        configs += [(f"tributary push/pull k={k} no fusion", "tributary", k,
                     lambda p, k=k: suite.tributary("push-pull", k, p, fusion=False))
                    for k in args.k]
    if "trib-ring" in wanted:
        configs.append(("tributary ring", "tributary", 0,
                        lambda p: suite.tributary("ring", 0, p)))
    if "trib-ring-nofusion" in wanted:
        configs.append(("tributary ring no fusion", "tributary", 0,
                        lambda p: suite.tributary("ring", 0, p, fusion=False)))
    if "trib-hd" in wanted:
        configs.append(("tributary halving-doubling", "tributary", 0,
                        lambda p: suite.tributary("hd", 0, p)))
    if "trib-rd" in wanted:
        configs.append(("tributary recursive doubling", "tributary", 0,
                        lambda p: suite.tributary("rd", 0, p)))
    if "trib-auto" in wanted:  # what a job gets by default: the agent's selector, per tensor
        configs += [(f"tributary auto k={k}", "tributary", k,
                     lambda p, k=k: suite.tributary("auto", k, p)) for k in args.k]
    # A workload's tensors in DDP's buckets, one all-reduce each, as the peers and tributary.torch's
    # DDP hook run them (workloads only: on single tensors they are the configurations above).
    for name, alg, ks, label in (("pp-buckets", "push-pull", args.k, "tributary push/pull k={k}"),
                                 ("trib-ring-buckets", "ring", [0], "tributary ring"),
                                 ("trib-auto-buckets", "auto", args.k, "tributary auto k={k}")):
        if name in wanted:
            configs += [(label.format(k=k) + BUCKETS_SUFFIX, "tributary", k,
                         lambda p, k=k, alg=alg: suite.tributary(alg, k, p, buckets=True))
                        for k in ks]
    if "trib-auto-nofusion" in wanted:
        configs += [(f"tributary auto k={k} no fusion", "tributary", k,
                     lambda p, k=k: suite.tributary("auto", k, p, fusion=False))
                    for k in args.k]
    for name, fam, alg in (("gloo-ring", "gloo", "ring"), ("gloo-hd", "gloo", "hd"),
                           ("mpi-default", "mpi", "default"), ("mpi-ring", "mpi", "ring")):
        if name not in wanted:
            continue
        if not peers.get(fam) or (fam == "mpi" and not shutil.which("mpirun")):
            log(f"# {name} skipped: peer not available")
            continue
        label = {"gloo": "Gloo", "mpi": "Open MPI"}[fam] + " " + {
            "ring": "ring", "hd": "halving-doubling", "default": "default"}[alg]
        runner = ((lambda p, a=alg: suite.gloo(a, p)) if fam == "gloo" else
                  (lambda p, a=alg: suite.mpi(a, p)))
        configs.append((label, fam, 0, runner))
    return configs


def config_k(config):
    """The k of a configuration label ("tributary push/pull k=4 no fusion" -> 4; 0 without)."""
    m = re.search(r"k=(\d+)", config)
    return int(m.group(1)) if m else 0


def sweep_configs(configs):
    """The configurations that run the single-tensor sweep: all but the DDP-bucket ones, which
    differ from their plain configuration on workloads only."""
    return [c for c in configs if not c[0].endswith(BUCKETS_SUFFIX)]


def run_sweep(suite, meter, configs):
    """Every band of every configuration, --repeats times, round-robin. Returns (rows
    aggregated per config and size, whether something failed)."""
    configs = sweep_configs(configs)
    units = [(c, band) for c in configs for band in suite.bands()]
    samples, cpu, failed = [], {}, False
    for rep, ((label, fam, k, runner), band) in interleave(units, suite.args.repeats):
        log(f"# run {rep + 1}/{suite.args.repeats}: {label}, {len(band.sizes.split(','))} sizes")
        measured = run_measured(meter, runner, label, band)
        if measured is None:
            failed = True
            continue
        got, spares_used, cpu_run, wall = measured
        cpu.setdefault(label, []).append((cpu_run, wall))
        log(f"#   {wall:.1f} s; CPU % per host: " +
            " ".join(f"h{h}={v:.0f}" for h, v in cpu_run.items()))
        for size, row in sorted(got.items()):
            if row["wrong"]:
                failed = True
                log(f"error: {label}: {row['wrong']} wrong elements at {size} B")
            samples.append(dict(config=label, family=fam, k=k, spares_used=spares_used,
                                size=size, **row))
    return aggregate_sweep(samples, cpu, suite.n), failed


def run_workloads(suite, meter, configs, work):
    """Every workload on every configuration, --repeats times round-robin across the
    configurations (one workload's rounds before the next workload's)."""
    samples, failed = [], False
    for wname in suite.args.workloads:
        path, ntensors, nbytes = write_workload(wname, work)
        _, iters, warmup = WORKLOADS[wname]
        iters, warmup = suite.args.workload_iters.get(wname, (iters, warmup))
        piece = Workload(wname, path, iters, warmup, nbytes)
        for rep, (label, fam, k, runner) in interleave(configs, suite.args.repeats):
            log(f"# run {rep + 1}/{suite.args.repeats}: {wname} on {label}")
            measured = run_measured(meter, runner, f"{wname} on {label}", piece)
            if measured is None:
                failed = True
                continue
            got, spares_used, cpu, wall = measured
            if got is None:
                log(f"error: {wname} on {label}: no result line")
                failed = True
                continue
            if got["wrong"]:
                failed = True
                log(f"error: {wname} on {label}: {got['wrong']} wrong elements")
            # The worker hosts' CPU per timed iteration, metered in the timed iterations' window
            # only (joins, warm-up and teardown differ between Tributary and the peers).
            got["timed_cpu_ms"] = timed_worker_cpu_ms(meter, got.pop("timed", None),
                                                      piece.iters, suite.n)
            log(f"#   {got['time_us'] / 1e3:.1f} ms per iteration" +
                ("" if got["timed_cpu_ms"] is None else
                 f", worker CPU {got['timed_cpu_ms']:.0f} core-ms per iteration") +
                ("" if "iterations_ms" not in got else
                 "; iterations (ms, warm-up first): " +
                 " ".join(f"{x:.0f}" for x in got.pop("iterations_ms"))))
            samples.append(dict(config=label, family=fam, k=k, spares_used=spares_used,
                                workload=wname, cpu=cpu, wall_s=wall, **got))
    return aggregate_workloads(samples), failed


def torch_configs(args):
    """--torch-iterations' configurations, in run order: (label, k, overlap_forward, DDP over
    the "tributary" backend, layer priorities); k None is DDP over PyTorch's Gloo."""
    ks = sorted({0, max(args.k)})
    configs = [(f"tributary.torch k={k}", k, False, False, False) for k in ks]
    if args.torch_overlap_forward:
        configs.append((f"tributary.torch k={max(args.k)} overlap", max(args.k), True, False,
                        False))
    if args.torch_layer_priorities:
        configs.append((f"tributary.torch k={max(args.k)} layer priorities", max(args.k), False,
                        False, True))
    configs += [(f"PyTorch DDP + tributary k={k}", k, False, True, False) for k in ks]
    configs.append(("PyTorch DDP + Gloo", None, False, False, False))
    only = getattr(args, "torch_only", None)
    if only:
        labels = [c[0] for c in configs]
        unknown = [label for label in only if label not in labels]
        if unknown:
            raise ValueError(f"--torch-only {unknown[0]!r}: no such configuration (these "
                             f"options give: {'; '.join(labels)})")
        configs = [c for c in configs if c[0] in only]
    return configs


def run_torch_iterations(suite, meter):
    """--torch-iterations: PyTorch training iterations (bench/suite/torch_iteration.py on every
    worker host) with tributary.torch at k = 0 and k = max(--k), and DDP over PyTorch's Gloo,
    --repeats times round-robin. Returns (aggregated rows, failed)."""
    args = suite.args
    if args.torch_iterations == "none":
        return [], False
    configs = torch_configs(args)
    samples, failed = [], False
    for rep, (label, k, overlap, ddp, layer) in interleave(configs, args.repeats):
        log(f"# run {rep + 1}/{args.repeats}: {args.torch_iterations} iteration, {label}")
        measured = run_measured(meter,
                                lambda _: suite.torch_iteration(k, overlap, ddp, layer), label,
                                None)
        if measured is None:
            failed = True
            continue
        got, spares_used, cpu, wall = measured
        if got is None or got["mismatch"]:
            log(f"error: {label}: " + ("no result line" if got is None else
                                       "ranks ended with different parameters"))
            failed = True
            continue
        got["timed_cpu_ms"] = timed_worker_cpu_ms(meter, got.pop("timed", None), got["iters"],
                                                  suite.n)
        log(f"#   iteration {got['iter_ms']:.0f} ms, compute {got['compute_ms']:.0f} ms, "
            f"communication {got['comm_ms']:.0f} ms" +
            ("" if got["timed_cpu_ms"] is None else
             f", worker CPU {got['timed_cpu_ms']:.0f} core-ms per iteration"))
        samples.append(dict(config=label, k=k, spares_used=spares_used, cpu=cpu, wall=wall,
                            **got))
    rows = []
    for label, k, *_ in configs:
        mine = [x for x in samples if x["config"] == label]
        if not mine:
            continue
        rows.append(dict(config=label, k=k, spares_used=mine[0]["spares_used"],
                         repeats=len(mine),
                         cpu=" ".join(f"{v:.0f}" for v in mean_cpu(
                             [(x["cpu"], x["wall"]) for x in mine]).values()),
                         **{key: statistics.median(x[key] for x in mine)
                            for key in ("iter_ms", "compute_ms", "comm_ms")},
                         timed_cpu_ms=median_or_none([x.get("timed_cpu_ms") for x in mine]),
                         comm_spread=time_stats([x["comm_ms"] for x in mine])["spread_pct"]))
    return rows, failed


def parse_torch_line(text):
    """The TORCHITER line of torch_iteration.py's rank 0 (with "timed", the timed iterations'
    window, when its WTIMED line came too), or None."""
    for line in text.splitlines():
        if line.startswith("TORCHITER,"):
            _, mode, ranks, it, comp, comm, iters, mismatch = line.strip().split(",")
            row = dict(mode=mode, ranks=int(ranks), iter_ms=float(it), compute_ms=float(comp),
                       comm_ms=float(comm), iters=int(iters), mismatch=int(mismatch))
            if (timed := timed_window(text)) is not None:
                row["timed"] = timed
            return row
    return None


def torch_report(trows, args, out):
    """The PyTorch iteration table (and torch_iterations.csv)."""
    if not trows:
        return []
    with open(os.path.join(out, "torch_iterations.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "spares_used", "repeats", "iter_ms", "compute_ms", "comm_ms",
                    "comm_spread_pct", "cpu_hosts", "worker_cpu_ms_timed"])
        for r in trows:
            w.writerow([r["config"], r["spares_used"], r["repeats"], f"{r['iter_ms']:.1f}",
                        f"{r['compute_ms']:.1f}", f"{r['comm_ms']:.1f}",
                        f"{r['comm_spread']:.2f}", r["cpu"],
                        "" if r.get("timed_cpu_ms") is None else f"{r['timed_cpu_ms']:.1f}"])
    ddp = next((r for r in trows if r["k"] is None), None)
    lines = ["", f"PyTorch training iterations (`--torch-iterations {args.torch_iterations}`): "
             f"torchvision's {args.torch_iterations} on {args.workers} worker hosts, one process "
             "each, CPU compute on random data (2 images of 64x64 per rank, one thread), SGD. "
             "tributary.torch.DistributedOptimizer starts each gradient's all-reduce from its "
             "gradient hook, in backward order (by layer order in the \"overlap\" and \"layer "
             "priorities\" configurations); PyTorch DDP (25 MiB buckets, "
             "overlapped with backward) runs unmodified over the \"tributary\" backend or "
             "PyTorch's own Gloo backend. Tributary's jobs: "
             f"`--algorithm {CLI_ALGORITHM[args.torch_algorithm]}`. Compute = the same iteration without communication, on the same "
             "host; communication = iteration - compute (what overlap did not hide). Medians of "
             f"{max(r['repeats'] for r in trows)} runs; each run checks that every rank ends "
             "with the same parameters. CPU % per host: over the whole run (model set-up and "
             "the compute-only iterations included). Worker CPU per iteration: the worker "
             "hosts' mean CPU time in the timed iterations' window, per iteration (compute, "
             "communication and the agents together).", "",
             "| config | iteration (ms) | compute (ms) | communication (ms) | spread | "
             "communication x DDP+Gloo | iteration x DDP+Gloo | CPU % per host | "
             "worker CPU per iteration (core-ms) | x DDP+Gloo's |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in trows:
        name = r["config"] + (f" ({r['spares_used']} used)" if r["k"] else "")
        cx = f"{ddp['comm_ms'] / r['comm_ms']:.2f}x" if ddp and r["comm_ms"] > 0 else "-"
        ix = f"{ddp['iter_ms'] / r['iter_ms']:.2f}x" if ddp else "-"
        cpu_ms = r.get("timed_cpu_ms")
        ddp_cpu = ddp.get("timed_cpu_ms") if ddp else None
        lines.append(f"| {name} | {r['iter_ms']:.0f} | {r['compute_ms']:.0f} | "
                     f"{r['comm_ms']:.0f} | {r['comm_spread']:.1f}% | {cx} | {ix} | "
                     f"{r['cpu']} | {fmt_opt(cpu_ms, '.0f')} | " +
                     (f"{cpu_ms / ddp_cpu:.2f}x" if cpu_ms and ddp_cpu else "-") + " |")
    return lines


def ceiling_patterns(suite, wanted):
    """{pattern name: flows} of the configurations that run (see pattern_for)."""
    n, patterns = suite.n, {}
    if any(c in wanted for c in ("trib-ring", "trib-ring-buckets", "gloo-ring", "mpi-default",
                                 "mpi-ring")):
        patterns["ring"] = ring_flows(n)
    if any(c in wanted for c in ("trib-hd", "gloo-hd")):
        patterns["halving-doubling"] = hd_flows(n)
    if "trib-rd" in wanted:
        patterns["recursive doubling"] = rd_flows(n)
    if any(c in wanted for c in ("pp", "trib-auto", "pp-buckets", "trib-auto-buckets")):
        for k in suite.args.k:
            try:
                servers = suite.plan_servers(k)
            except RuntimeError as e:
                log(f"error: ceiling of push/pull k={k}: {e}")
                continue
            used = sum(1 for h in servers if h >= n)
            patterns.setdefault(f"push/pull {used} spares", push_pull_flows(n, servers))
    return patterns


def measure_ceilings(suite, patterns, rates, probes):
    """Probes every pattern with every --ceiling-congestion `probes` times (round-robin), adding
    bytes/s per host to rates[pattern][congestion control]. Returns False when a probe failed."""
    host_bytes = int(model_rate(suite.args.rate) * suite.args.ceiling_seconds)
    ok = True
    ccs, available = [], available_congestion_controls()
    for cc in ceiling_congestions(suite.args.ceiling_congestion):
        if cc == SYSTEM_CONGESTION or cc in available:
            ccs.append(cc)
        else:
            log(f"# plain TCP: congestion control {cc} is not in this kernel "
                f"({' '.join(sorted(available))}); not probed")
    keys = [(name, cc) for name in patterns for cc in ccs]
    for rep, (name, cc) in interleave(keys, probes):
        try:
            rate = suite.probe(patterns[name], host_bytes,
                               None if cc == SYSTEM_CONGESTION else cc)
        except (RuntimeError, OSError, ValueError) as e:
            log(f"error: plain-TCP probe of {name} ({cc}): {e}")
            ok = False
            continue
        rates[name].setdefault(cc, []).append(rate)
        log(f"# plain TCP, {name} ({congestion_label(cc)}): {rate * 8 / 1e6:.0f} Mbit/s per host "
            f"({rate / model_rate(suite.args.rate):.3f} x B)")
    return ok


def ceiling_congestions(text):
    """--ceiling-congestion's list: names, "system" for the host's default; duplicates dropped."""
    out = []
    for cc in (c.strip() for c in text.split(",")):
        if cc and cc not in out:
            out.append(cc)
    return out or [SYSTEM_CONGESTION]


def available_congestion_controls():
    """net.ipv4.tcp_available_congestion_control of this host (empty when unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            return set(f.read().split())
    except OSError:
        return set()


def congestion_label(cc):
    """"system (bbr)" for the host's default, else the name."""
    return f"{cc} ({host_congestion_control()})" if cc == SYSTEM_CONGESTION else cc


def family_of(config):
    return ("gloo" if config.startswith("Gloo") else
            "mpi" if config.startswith("Open MPI") else "tributary")


def repeats_from_csv(row):
    """time_stats of a CSV row: its repeats' times where the CSV has them (this script since
    --repeats), else the one time of an older CSV; the ceiling columns where present."""
    times = [float(t) for t in (row.get("times_us") or "").split()] or [float(row["time_us"])]
    stats = time_stats(times)
    stats["time_us"] = float(row["time_us"])  # the median as written (identical when recomputed)
    if row.get("ceiling_us") not in (None, "", "-"):
        stats.update(ceiling_us=float(row["ceiling_us"]), ceiling_from_csv=True,
                     ceiling_pattern=row.get("ceiling_pattern", ""))
    return stats


def merge(results, path):
    """Adds the rows of `path` (a CSV this script wrote, with or without the repeats' and the
    ceiling's columns) whose config did not run now."""
    ran = {r["config"] for r in results}
    old = []
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["config"] in ran:
                continue
            k = config_k(row["config"])
            cpu = {i: float(v) for i, v in enumerate(row["cpu_pct_per_host"].split())}
            old.append(dict(config=row["config"], family=family_of(row["config"]), k=k,
                            spares_used=int(row["spares_used"]), size=int(row["size_bytes"]),
                            algbw=float(row["algbw_GBps"]), busbw=float(row["busbw_GBps"]),
                            wrong=int(row["wrong"]), cpu=cpu, **repeats_from_csv(row)))
    log(f"# kept {len(old)} rows from {path}")
    return old + results


CEILING_CSV_HEADER = ["pattern", "flows", "bytes_per_tensor_byte", "rate_mbit_per_host",
                      "rate_vs_model", "probes_bytes_per_s", "congestion", "probes_by_congestion"]


def write_ceilings(ceilings, rate_mbit, path):
    """emulated_ceiling.csv: every pattern's probes at full precision (a rebuilt report is
    identical), with the median in Mbit/s and relative to the model's B for reading."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CEILING_CSV_HEADER)
        for c in ceilings.values():
            w.writerow([c["pattern"], c["flows"], repr(c["unit"]),
                        f"{c['rate'] * 8 / 1e6:.1f}", f"{c['rate'] / model_rate(rate_mbit):.4f}",
                        " ".join(repr(r) for r in c["rates"]), c["congestion"],
                        ";".join(f"{cc}:" + " ".join(repr(r) for r in rs)
                                 for cc, rs in c["by_congestion"].items())])


def load_ceilings(path):
    """The ceilings of emulated_ceiling.csv ({} when the run had none)."""
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            rates = [float(v) for v in row["probes_bytes_per_s"].split()]
            cc = row.get("congestion") or SYSTEM_CONGESTION
            by = {cc: rates}
            if row.get("probes_by_congestion"):
                by = {}
                for part in row["probes_by_congestion"].split(";"):
                    name, _, values = part.partition(":")
                    by[name] = [float(v) for v in values.split()]
            out[row["pattern"]] = {"pattern": row["pattern"], "flows": int(row["flows"]),
                                   "unit": float(row["bytes_per_tensor_byte"]), "rates": rates,
                                   "rate": statistics.median(rates) if rates else 0.0,
                                   "congestion": cc, "by_congestion": by}
    return out


def ceiling_report(ceilings, rate_mbit):
    """The plain-TCP ceiling's table (markdown lines)."""
    if not ceilings:
        return ["Plain-TCP ceiling: not measured in this run.", ""]
    b = model_rate(rate_mbit)
    lines = ["Plain-TCP ceiling: each configuration's traffic pattern with plain TCP sockets "
             "(every flow at once, a fixed byte count), rate per host = bytes of the busiest "
             "host / time to the last byte; median of the probes, of the senders' TCP "
             "congestion control whose median is highest (\"system\" is the host's default, "
             "which Gloo's and MPI's sockets run, and so do the agents' unless "
             "--tcp-congestion says otherwise). Time at the ceiling = pattern bytes per host "
             "for the size / that rate.", "",
             "| pattern | flows | bytes per host per tensor byte | Mbit/s per host | x B "
             "(model) | congestion control | probes (Mbit/s) |",
             "|---|---:|---:|---:|---:|---|---|"]
    for c in ceilings.values():
        lines.append(f"| {c['pattern']} | {c['flows']} | {c['unit']:.3f} | "
                     f"{c['rate'] * 8 / 1e6:.0f} | {c['rate'] / b:.3f} | {c['congestion']} | " +
                     "; ".join(f"{cc}: " + " ".join(f"{r * 8 / 1e6:.0f}" for r in rs)
                               for cc, rs in c["by_congestion"].items()) + " |")
    return lines + [""]


def fmt_opt(v, spec):
    return "-" if v is None else format(v, spec)


def spare_report(results, n):
    """What the spare CPU hosts buy: push/pull with k spares against Tributary's ring (and the
    best peer), measured, next to DESIGN.md's ratio D / n^2 (ring moves 2(n-1)/n of the tensor
    through every NIC, push/pull 2n(n-1)/D)."""
    sizes = sorted({r["size"] for r in results if r["size"] >= 1 * MIB})
    pp = sorted({r["spares_used"] for r in results if r["config"].startswith("tributary push/pull")})
    if not pp or not sizes:
        return []
    base_name = "tributary ring"
    lines = ["What the spare CPU hosts buy (speed-up of push/pull over Tributary ring; theory "
             "D / n^2 with D = n^2 + kn - 2k):", "",
             "| size | " + " | ".join(f"k={k} measured (theory)" for k in pp) + " |",
             "|---:|" + "---:|" * len(pp)]
    for s in sizes:
        base = get(results, base_name, s)
        if not base:
            continue
        cells = []
        for k in pp:
            r = next((x for x in results if x["size"] == s and x["spares_used"] == k and
                      x["config"].startswith("tributary push/pull")), None)
            d = n * n + min(k, n) * n - 2 * min(k, n)
            cells.append(f"{base['time_us'] / r['time_us']:.2f}x ({d / (n * n):.2f}x)" if r
                         else "-")
        lines.append(f"| {fmt_size(s)} | " + " | ".join(cells) + " |")
    return lines + [""] if len(lines) > 4 else []


def message_steps(config, n, k):
    """Messages on the critical path in DESIGN.md §1.4's model (algorithm_selector.h)."""
    if config == "tributary ring":
        return 2 * (n - 1)
    if config == "tributary halving-doubling":
        p = 1 << (n.bit_length() - 1)
        return 2 * (p.bit_length() - 1) + (2 if p != n else 0)
    if config == "tributary recursive doubling":
        p = 1 << (n.bit_length() - 1)
        return (p.bit_length() - 1) + (2 if p != n else 0)
    return 2 * (n + k - 1)


def recursive_doubling_below(results):
    """The size below which Tributary's recursive doubling beat its ring and halving-doubling at
    every measured size (0: not even at the smallest; past the largest size measured when it
    always won), or None when it did not run."""
    sizes = sorted({r["size"] for r in results if r["config"] == "tributary recursive doubling"})
    for s in sizes:
        rd = get(results, "tributary recursive doubling", s)
        others = [r for r in (get(results, "tributary ring", s),
                              get(results, "tributary halving-doubling", s)) if r]
        if any(o["time_us"] <= rd["time_us"] for o in others):
            return s if s != sizes[0] else 0
    return sizes[-1] + 1 if sizes else None


def calibration(results, n, rate, out):
    """The selector's inputs, measured: each Tributary algorithm's per-message cost alpha (small
    sizes, bandwidth term removed) and the crossover sizes between the algorithms. Writes
    selector_calibration.json; returns markdown lines."""
    trib = [r for r in results if r["family"] == "tributary"]
    alphas = {}
    for c in dict.fromkeys(r["config"] for r in trib):
        if c.startswith("tributary auto"):  # several algorithms: no one message count
            continue
        rs = [r for r in trib if r["config"] == c and r["size"] <= 64 << 10]
        fits = []
        for r in rs:
            # Ring and halving-doubling move 2(n-1)/n of the tensor: theory with k = 0.
            k = r["spares_used"] if "push/pull" in c else 0
            bw = theory_seconds(r["size"], n, k, rate)
            fits.append((r["time_us"] * 1e-6 - bw) / message_steps(
                "push/pull" if "push/pull" in c else c, n, k))
        if fits:
            alphas[c] = statistics.median(fits)

    def crossover(a, b_name):
        """Smallest size from which b_name is faster than a at every measured size (or None)."""
        sizes = sorted({r["size"] for r in trib})
        from_size = None
        for s in sizes:
            ra, rb = get(results, a, s), get(results, b_name, s)
            if not ra or not rb:
                continue
            if rb["time_us"] < ra["time_us"]:
                from_size = s if from_size is None else from_size
            else:
                from_size = None
        return from_size

    cal = {"workers": n, "rate_mbit": rate,
           "alpha_seconds": {c: round(a, 7) for c, a in alphas.items()},
           "alpha_seconds_median": round(statistics.median(alphas.values()), 7) if alphas else None,
           "ring_beats_halving_doubling_from": crossover("tributary halving-doubling",
                                                         "tributary ring"),
           "push_pull_beats_ring_from": {}}
    rd_below = recursive_doubling_below(results)
    if rd_below is not None:
        cal["recursive_doubling_below"] = rd_below
    for k in sorted({r["spares_used"] for r in trib if "push/pull" in r["config"]}):
        name = next(r["config"] for r in trib if "push/pull" in r["config"] and
                    r["spares_used"] == k)
        cal["push_pull_beats_ring_from"][f"k={k}"] = crossover("tributary ring", name)
    with open(os.path.join(out, "selector_calibration.json"), "w") as f:
        json.dump(cal, f, indent=2)
        f.write("\n")
    fmt = lambda v: fmt_size(v) if v else "never"  # noqa: E731
    lines = ["Selector calibration (`selector_calibration.json`): per-message cost alpha fitted "
             "from sizes <= 64 KiB: " + ", ".join(f"{c} {a * 1e6:.0f} us" for c, a in
                                                  alphas.items()) +
             (f"; recursive doubling fastest below {fmt(rd_below)}" if rd_below is not None
              else "") +
             f"; ring beats halving-doubling from "
             f"{fmt(cal['ring_beats_halving_doubling_from'])}; push/pull beats ring from " +
             ", ".join(f"{k}: {fmt(v)}" for k, v in cal["push_pull_beats_ring_from"].items()) +
             ".", ""]
    return lines


def fmt_spread(r):
    """(max - min) / median of the repeats, or "-" for a single run."""
    return f"{r['spread_pct']:.1f}%" if r.get("repeats", 1) > 1 else "-"


def workload_report(wresults, args, out, ceilings=None):
    """The model workloads' table (markdown lines) and CSV."""
    if not wresults:
        return []
    n, rate = args.workers, args.rate
    lines = ["Model workloads: one training iteration's gradients, all-reduced (float32). "
             "Tributary submits every tensor at once in backward order, with priorities "
             "(first layers first; the DDP-bucket rows: every 25 MiB bucket at once, one "
             "all-reduce each, first layers first); the peers all-reduce DDP-style 25 MiB buckets one after "
             "another. Time = iteration communication time, first submission to last result "
             "(median of the runs; spread = (max - min) / median). CPU % per host: over the "
             "whole run (join, warm-up, timed iterations). Worker CPU per iteration: the worker "
             "hosts' mean CPU time between the first timed iteration's start and the last one's "
             "end (every process of the host, agents included), per timed iteration.",
             "",
             "| workload | config | tensors | bytes | time (ms) | spread | model (ms) | "
             "ceiling (ms) | eff. vs model | eff. vs ceiling | x best peer | CPU % per host | "
             "worker CPU per iteration (core-ms) | x best peer's | #wrong |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]

    def worker_cpu_ms(r):
        """The worker hosts' mean CPU time per iteration (the target compares CPU at equal
        throughput, i.e. per iteration): metered in the timed iterations' window when the run
        reported it, else their mean CPU % over the whole run x the time."""
        if r.get("timed_cpu_ms") is not None:
            return r["timed_cpu_ms"]
        workers = list(r["cpu"].values())[:n]
        return statistics.mean(workers) / 100 * r["time_us"] / 1e3 if workers else float("nan")

    rows = []
    for wname in dict.fromkeys(r["workload"] for r in wresults):
        ws = [r for r in wresults if r["workload"] == wname]
        peers = [r for r in ws if r["family"] in ("gloo", "mpi")]
        best = min(peers, key=lambda r: r["time_us"]) if peers else None
        for r in ws:
            kk = r["spares_used"] if uses_spares(r["config"]) else 0
            r["theory_us"] = theory_seconds(r["bytes"], n, kk, rate) * 1e6
            r["efficiency"] = r["theory_us"] / r["time_us"]
            add_ceiling(r, ceilings, r["bytes"], rate)
            r["vs_best_peer"] = best["time_us"] / r["time_us"] if best else float("nan")
            r["best_peer"] = best["config"] if best else ""
            cpu = " ".join(f"{v:.1f}" for v in r["cpu"].values())
            r["worker_cpu_ms"] = worker_cpu_ms(r)
            cpu_vs_peer = r["worker_cpu_ms"] / worker_cpu_ms(best) if best else float("nan")
            name = r["config"] + (f" ({r['spares_used']} used)" if uses_spares(r["config"])
                                  else "")
            ceiling_ms = None if r["ceiling_us"] is None else r["ceiling_us"] / 1e3
            lines.append(f"| {wname} | {name} | {r['tensors']} | {fmt_size(r['bytes'])} | "
                         f"{r['time_us'] / 1e3:.0f} | {fmt_spread(r)} | "
                         f"{r['theory_us'] / 1e3:.0f} | {fmt_opt(ceiling_ms, '.0f')} | "
                         f"{r['efficiency']:.2f} | {fmt_opt(r['efficiency_vs_ceiling'], '.2f')} | "
                         f"{r['vs_best_peer']:.2f} | {cpu} | {r['worker_cpu_ms']:.0f} | "
                         f"{cpu_vs_peer:.2f} | {r['wrong']} |")
            rows.append([wname, r["config"], r["tensors"], r["bytes"], f"{r['time_us']:.1f}",
                         f"{r['time_min_us']:.1f}", f"{r['time_max_us']:.1f}",
                         f"{r['spread_pct']:.2f}", r["repeats"],
                         " ".join(f"{t:.1f}" for t in r["times_us"]),
                         f"{r['theory_us']:.1f}", f"{r['efficiency']:.3f}",
                         r["ceiling_pattern"], fmt_opt(r["ceiling_us"], ".1f"),
                         fmt_opt(r["efficiency_vs_ceiling"], ".3f"),
                         f"{r['vs_best_peer']:.3f}", r["best_peer"], r["spares_used"], cpu,
                         f"{r['worker_cpu_ms']:.1f}", r["wrong"],
                         "" if r.get("timed_cpu_ms") is None else f"{r['timed_cpu_ms']:.1f}"])
    with open(os.path.join(out, "emulated_workloads.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload", "config", "tensors", "bytes", "time_us", "time_min_us",
                    "time_max_us", "spread_pct", "repeats", "times_us", "theory_us",
                    "efficiency", "ceiling_pattern", "ceiling_us", "efficiency_vs_ceiling",
                    "speedup_vs_best_peer", "best_peer", "spares_used", "cpu_pct_per_host",
                    "worker_cpu_ms_per_iteration", "wrong", "worker_cpu_ms_timed"])
        w.writerows(rows)
    return lines + [""]


def load_workloads(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for row in csv.DictReader(f):
            out.append(dict(config=row["config"], family=family_of(row["config"]),
                            workload=row["workload"], tensors=int(row["tensors"]),
                            bytes=int(row["bytes"]), wrong=int(row["wrong"]),
                            spares_used=int(row["spares_used"]),
                            cpu={i: float(v) for i, v in
                                 enumerate(row["cpu_pct_per_host"].split())},
                            timed_cpu_ms=(float(row["worker_cpu_ms_timed"])
                                          if row.get("worker_cpu_ms_timed") else None),
                            **repeats_from_csv(row)))
    return out


SWEEP_CSV_HEADER = ["config", "size_bytes", "time_us", "time_min_us", "time_max_us",
                    "spread_pct", "repeats", "times_us", "algbw_GBps", "busbw_GBps", "wrong",
                    "theory_us", "efficiency", "ceiling_pattern", "ceiling_us",
                    "efficiency_vs_ceiling", "speedup_vs_best_peer", "best_peer",
                    "spares_used", "cpu_pct_per_host"]


def annotate(results, n, rate, ceilings):
    """Adds to every row (medians) the model's time, the ceiling's, both efficiencies, the
    speed-up over the best peer at its size; returns {size: best peer row}."""
    best_peer = {}
    for s in sorted({r["size"] for r in results}):
        cand = [r for r in results if r["size"] == s and r["family"] in ("gloo", "mpi")]
        if cand:
            best_peer[s] = min(cand, key=lambda r: r["time_us"])
    for r in results:
        kk = r["spares_used"] if uses_spares(r["config"]) else 0
        r["theory_us"] = theory_seconds(r["size"], n, kk, rate) * 1e6
        r["efficiency"] = r["theory_us"] / r["time_us"]
        add_ceiling(r, ceilings, r["size"], rate)
        bp = best_peer.get(r["size"])
        r["vs_best_peer"] = bp["time_us"] / r["time_us"] if bp else float("nan")
        r["best_peer"] = bp["config"] if bp else ""
        r["cpu_max"] = max(r["cpu"].values(), default=0.0)
        r["cpu_hosts"] = " ".join(f"{v:.0f}" for v in r["cpu"].values())
    return best_peer


def report(results, args, out, argv, update_md, wresults=(), ceilings=None, tresults=()):
    n, rate = args.workers, args.rate
    sizes = sorted({r["size"] for r in results})
    best_peer = annotate(results, n, rate, ceilings)

    csv_path = os.path.join(out, "emulated_allreduce.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SWEEP_CSV_HEADER)
        for r in results:
            w.writerow([r["config"], r["size"], f"{r['time_us']:.1f}", f"{r['time_min_us']:.1f}",
                        f"{r['time_max_us']:.1f}", f"{r['spread_pct']:.2f}", r["repeats"],
                        " ".join(f"{t:.1f}" for t in r["times_us"]), f"{r['algbw']:.4f}",
                        f"{r['busbw']:.4f}", r["wrong"], f"{r['theory_us']:.1f}",
                        f"{r['efficiency']:.3f}", r["ceiling_pattern"],
                        fmt_opt(r["ceiling_us"], ".1f"),
                        fmt_opt(r["efficiency_vs_ceiling"], ".3f"), f"{r['vs_best_peer']:.3f}",
                        r["best_peer"], r["spares_used"], r["cpu_hosts"]])
    if ceilings:
        write_ceilings(ceilings, rate, os.path.join(out, "emulated_ceiling.csv"))

    repeats = max([r.get("repeats", 1) for r in list(results) + list(wresults)] + [1])
    lines = []
    lines.append(f"Emulated cluster: {n} workers (+ up to {max(args.k)} spare CPU hosts), "
                 f"{rate} Mbit/s per host each way (tc tbf), MTU {args.mtu}, float32 sum, "
                 f"model with B = {TCP_EFFICIENCY:.4f} x rate.")
    lines.append("")
    lines.append("Command: `bench/suite/run.py " + argv + "`" if argv else
                 "Command: `bench/suite/run.py`")
    lines.append("")
    lines.append((f"Times are the median of {repeats} runs of every configuration, interleaved "
                  "round-robin across the configurations; spread = (max - min) / median; every "
                  "ratio is of medians." if repeats > 1 else
                  "Times are of one run of every configuration (no spread).") +
                 " Model = DESIGN.md §1.1; ceiling = the same traffic pattern with plain TCP "
                 "sockets on this cluster, measured in the same run.")
    if results and not getattr(args, "from_results", None):  # else: the original run's counts
        lines.append("")
        lines.append(f"A run's time is rank 0's mean over {args.small_iters} timed iterations up "
                     f"to {args.small_upto}, {args.iters} below {args.large_from} and "
                     f"{args.large_iters} from there ({args.warmup} warm-up).")
    lines.append("")
    lines += ceiling_report(ceilings, rate)
    if results:  # an empty --sizes runs the workloads only
        lines.append("| config | size | time (us) | spread | algbw (GB/s) | busbw (GB/s) | "
                     "model (us) | ceiling (us) | eff. vs model | eff. vs ceiling | x best peer | "
                     "CPU % per host (sweep) | #wrong |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        configs = list(dict.fromkeys(r["config"] for r in results))
        for s in sizes:
            for c in configs:
                for r in results:
                    if r["config"] == c and r["size"] == s:
                        name = c + (f" ({r['spares_used']} used)" if uses_spares(c) else "")
                        lines.append(
                            f"| {name} | {fmt_size(s)} | {r['time_us']:.0f} | {fmt_spread(r)} | "
                            f"{r['algbw']:.4f} | {r['busbw']:.4f} | {r['theory_us']:.0f} | "
                            f"{fmt_opt(r['ceiling_us'], '.0f')} | {r['efficiency']:.2f} | "
                            f"{fmt_opt(r['efficiency_vs_ceiling'], '.2f')} | "
                            f"{r['vs_best_peer']:.2f} | {r['cpu_hosts']} | {r['wrong']} |")
        lines.append("")
        lines.append("CPU % per host: CPU time of every process in host h0, h1, ... over all of that "
                     "configuration's sweep runs, in % of one core (agents included).")
        lines.append("")
        lines += spare_report(results, n)
        lines += calibration(results, n, rate, out)
    lines += workload_report(list(wresults), args, out, ceilings)
    lines += torch_report(list(tresults), args, out)
    if results:
        lines += targets(results, best_peer)
    md = "\n".join(lines) + "\n"
    md_path = os.path.join(out, "emulated_allreduce.md")
    with open(md_path, "w") as f:
        f.write(md)
    print("\n" + md, flush=True)
    png_path = os.path.join(out, "emulated_allreduce.png")
    plotted = bool(results) and plot(results, png_path, n, rate)
    log(f"# wrote {csv_path}, {md_path}" + (f", {png_path}" if plotted else ""))
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
    # k = 0 at least as fast as the best peer from 16 MiB: push/pull forced, and the agent's
    # own choice (auto) when it ran.
    big = [s for s in sizes if s >= 16 * MIB]
    for label in ("push/pull k=0", "auto k=0"):
        worst = None
        for s in big:
            r = get(results, f"tributary {label}", s)
            if r and (worst is None or r["vs_best_peer"] < worst[1]):
                worst = (s, r["vs_best_peer"])
        if worst:
            ok = worst[1] >= 1.0
            out.append(f"* {label} >= best peer from 16 MiB: {'MET' if ok else 'MISSED'} "
                       f"(worst {worst[1]:.2f}x at {fmt_size(worst[0])}"
                       + ("" if ok else f", {100 * (1 - worst[1]):.0f}% short") + ")")
    r = get(results, "tributary push/pull k=4", 64 * MIB)
    if r:
        ok = r["vs_best_peer"] >= 1.40
        out.append(f"* push/pull k=4 >= 1.40x best peer at 64 MiB: {'MET' if ok else 'MISSED'} "
                   f"({r['vs_best_peer']:.2f}x vs {r['best_peer']}"
                   + ("" if ok else f", {1.40 - r['vs_best_peer']:.2f}x short") + ")")
    trib = [r for r in results if r["family"] == "tributary" and r["size"] >= 16 * MIB and
            r.get("efficiency_vs_ceiling") is not None]
    if trib:
        misses = [r for r in trib if r["efficiency_vs_ceiling"] < 0.90]
        if not misses:
            out.append("* Tributary within 10% of the plain-TCP ceiling of its pattern from "
                       "16 MiB: MET")
        else:
            out.append(f"* Tributary within 10% of the plain-TCP ceiling of its pattern from "
                       f"16 MiB: MISSED in {len(misses)} of {len(trib)} rows:")
            for r in misses:
                out.append(f"  * {r['config']} {fmt_size(r['size'])}: "
                           f"{r['efficiency_vs_ceiling']:.2f} of the ceiling")
    small = sizes[0]
    mpi_ring = get(results, "Open MPI ring", small)
    rows = [r for r in results if r["family"] == "tributary" and r["size"] == small]
    if rows and mpi_ring:
        limit = 1.5 * mpi_ring["time_us"]
        best = min(rows, key=lambda r: r["time_us"])
        ok = best["time_us"] <= limit
        out.append(f"* {fmt_size(small)} latency <= 1.5x Open MPI ring's "
                   f"({mpi_ring['time_us']:.0f} us): {'MET' if ok else 'MISSED'} by the fastest "
                   f"Tributary algorithm, {best['config']} ({best['time_us']:.0f} us, "
                   f"{best['time_us'] / mpi_ring['time_us']:.2f}x); each:")
        for r in rows:
            out.append(f"  * {r['config']}: {r['time_us']:.0f} us "
                       f"({r['time_us'] / mpi_ring['time_us']:.2f}x)")
    return out


def plot(results, path, n, rate):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"# no matplotlib for {sys.executable}: plot skipped")
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    for c in dict.fromkeys(r["config"] for r in results):
        rs = sorted((r for r in results if r["config"] == c), key=lambda r: r["size"])
        style = "-o" if rs[0]["family"] == "tributary" else "--s"
        x = [r["size"] for r in rs]
        # Error bars: the repeats' fastest and slowest run around the median.
        bus = [r["busbw"] for r in rs]
        bus_lo = [max(0.0, b * (1 - r["time_us"] / r["time_max_us"])) if r["time_max_us"]
                  else 0.0 for b, r in zip(bus, rs)]
        bus_hi = [max(0.0, b * (r["time_us"] / r["time_min_us"] - 1)) if r["time_min_us"]
                  else 0.0 for b, r in zip(bus, rs)]
        ms = [r["time_us"] / 1e3 for r in rs]
        ms_lo = [max(0.0, r["time_us"] - r["time_min_us"]) / 1e3 for r in rs]
        ms_hi = [max(0.0, r["time_max_us"] - r["time_us"]) / 1e3 for r in rs]
        ax1.errorbar(x, bus, yerr=[bus_lo, bus_hi], fmt=style, ms=3, capsize=2, label=c)
        ax2.errorbar(x, ms, yerr=[ms_lo, ms_hi], fmt=style, ms=3, capsize=2, label=c)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("busbw (GB/s)")
    ax2.set_ylabel("time (ms)")
    ax2.set_yscale("log")
    ax1.axhline(rate * 1e6 / 8 * TCP_EFFICIENCY / 1e9, color="gray", lw=0.8, ls=":")
    repeats = max(r.get("repeats", 1) for r in results)
    ax1.set_title(f"all-reduce, {n} workers, {rate} Mbit/s (tc tbf), median of {repeats} "
                  "(bars: min..max)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


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
