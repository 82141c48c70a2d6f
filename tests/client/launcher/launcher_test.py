"""Tests of tributary-run (client/launcher): environment, output, exit status, stopping ranks.

Run by ctest as: python3 launcher_test.py --bin-dir BUILD/bin
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

BIN_DIR = None
# Bound on one launcher run: cluster start (a few seconds) + the ranks + cluster stop.
RUN_TIMEOUT_S = 60


def run(args, timeout=RUN_TIMEOUT_S):
    """Runs tributary-run with `args`; returns (exit status, stdout, stderr, seconds)."""
    start = time.monotonic()
    p = subprocess.run([os.path.join(BIN_DIR, "tributary-run")] + args, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - start


def record_pid(folder):
    """Shell code that records the shell's pid as FOLDER/RANK.pid, atomically (write, rename)."""
    return (f'echo $$ > {folder}.$TRIBUTARY_RANK.tmp && '
            f'mv {folder}.$TRIBUTARY_RANK.tmp {folder}/$TRIBUTARY_RANK.pid; ')


def read_pids(folder):
    pids = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            pids.append(int(f.read()))
    return pids


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is as good as gone (reaped by init once the launcher is gone).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class LauncherTest(unittest.TestCase):
    def test_every_rank_gets_its_environment_and_prefixed_output(self):
        script = ('echo "env $TRIBUTARY_RANK $TRIBUTARY_WORLD_SIZE $TRIBUTARY_LOCAL_RANK '
                  '$TRIBUTARY_LOCAL_SIZE $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE '
                  '$MASTER_ADDR $MASTER_PORT $TRIBUTARY_JOB $TRIBUTARY_AGENT_ADDRESS"; '
                  'echo "to stderr $TRIBUTARY_RANK" >&2; printf "no newline"')
        code, out, err, _ = run(["--np", "4", "--procs-per-node", "2", "--spares", "2", "--job",
                                 "envjob", "--", "/bin/sh", "-c", script])
        self.assertEqual(code, 0, err)
        agents = {}
        ports = set()
        for rank in range(4):
            m = re.search(rf"^\[{rank}\] env (.*)$", out, re.M)
            self.assertIsNotNone(m, out)
            f = m.group(1).split()
            self.assertEqual(f[:8], [str(rank), "4", str(rank % 2), "2", str(rank), "4",
                                     str(rank % 2), "2"])
            self.assertEqual(f[8], "127.0.0.1")
            ports.add(f[9])
            self.assertEqual(f[10], "envjob")
            self.assertTrue(f[11].startswith("unix:"), f[11])
            agents.setdefault(rank // 2, set()).add(f[11])
            self.assertIn(f"[{rank}] no newline\n", out)
            self.assertIn(f"[{rank}] to stderr {rank}\n", err)
        self.assertEqual(len(ports), 1)
        # The two processes of a node share its agent; the nodes' agents differ.
        self.assertEqual([len(a) for a in agents.values()], [1, 1])
        self.assertNotEqual(agents[0], agents[1])

    def _run_with_one_failing_rank(self, trap_term):
        with tempfile.TemporaryDirectory() as parent:
            tmp = os.path.join(parent, "pids")
            os.mkdir(tmp)
            # Every rank but 2 records its pid and sleeps "forever" (optionally ignoring
            # SIGTERM, so that only SIGKILL ends it); rank 2 waits until they all have started,
            # then fails with status 3.
            trap = 'trap "" TERM; ' if trap_term else ""
            script = (f'if [ "$TRIBUTARY_RANK" = 2 ]; then '
                      f'while [ $(ls {tmp} | wc -l) -lt 3 ]; do sleep 0.05; done; exit 3; fi; '
                      f'{trap}{record_pid(tmp)}exec sleep 1000')
            code, out, err, seconds = run(["--np", "4", "--procs-per-node", "2", "--spares",
                                           "2", "--stop-grace-ms", "1000", "--",
                                           "/bin/sh", "-c", script])
            pids = read_pids(tmp)
        self.assertEqual(code, 3, err)
        self.assertIn("rank 2 exited with status 3; stopping the other ranks", err)
        self.assertEqual(len(pids), 3)
        for pid in pids:
            self.assertFalse(alive(pid), f"rank process {pid} survived the launcher")
        # Cluster start and stop take a few seconds; the ranks must not add their 1000 s.
        self.assertLess(seconds, 30)
        return err

    def test_failing_rank_fails_the_launch_and_stops_the_others(self):
        err = self._run_with_one_failing_rank(trap_term=False)
        self.assertNotIn("SIGKILL", err)

    def test_ranks_ignoring_sigterm_are_killed_after_the_grace(self):
        err = self._run_with_one_failing_rank(trap_term=True)
        self.assertIn("ranks still running after SIGTERM: SIGKILL", err)

    def test_sigint_to_the_launcher_stops_the_ranks(self):
        with tempfile.TemporaryDirectory() as parent:
            tmp = os.path.join(parent, "pids")
            os.mkdir(tmp)
            p = subprocess.Popen([os.path.join(BIN_DIR, "tributary-run"), "--np", "2", "--",
                                  "/bin/sh", "-c",
                                  record_pid(tmp) + "exec sleep 1000"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while len(os.listdir(tmp)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # polling for the ranks' pid files, bounded by the deadline
            self.assertEqual(len(os.listdir(tmp)), 2)
            pids = read_pids(tmp)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=RUN_TIMEOUT_S)
        self.assertEqual(p.returncode, 128 + signal.SIGINT, err)
        for pid in pids:
            self.assertFalse(alive(pid))

    def test_command_that_cannot_run_is_a_clear_failure(self):
        code, _, err, _ = run(["--np", "1", "--", "/nonexistent/train"])
        self.assertEqual(code, 127)
        self.assertIn("cannot execute /nonexistent/train: No such file or directory", err)

    def test_bad_arguments_are_rejected_before_anything_starts(self):
        code, _, err, seconds = run(["--np", "3", "--procs-per-node", "2", "--", "true"])
        self.assertEqual(code, 1)
        self.assertIn("--np 3 is not a multiple of --procs-per-node 2", err)
        code, _, err, _ = run(["--np", "2", "--controller", "127.0.0.1:1", "--", "true"])
        self.assertEqual(code, 1)
        self.assertIn("give --workers and --agents", err)
        code, _, err, _ = run(["--np", "2"])
        self.assertNotEqual(code, 0)
        self.assertIn("command is required", err)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args, rest = parser.parse_known_args()
    BIN_DIR = args.bin_dir
    unittest.main(argv=[sys.argv[0]] + rest)
