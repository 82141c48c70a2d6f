#!/usr/bin/python3
"""Unit tests of bench/suite/run.py's pure parts: the model workloads, the theory, the reports."""
import importlib.util
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("suite_run", os.path.join(ROOT, "bench", "suite",
                                                                        "run.py"))
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


class Workloads(unittest.TestCase):
    def test_resnet50_matches_torchvision(self):
        t = run.resnet50_tensors()
        self.assertEqual(len(t), 161)
        self.assertEqual(sum(c for _, c in t), 25_557_032)
        self.assertEqual(t[0], ("fc.bias", 1000))          # backward order: last layer first
        self.assertEqual(t[-1], ("conv1.weight", 9408))

    def test_bert_large_matches_the_published_size(self):
        t = run.bert_large_tensors()
        self.assertEqual(len(t), 391)
        self.assertEqual(sum(c for _, c in t), 335_141_888)
        self.assertEqual(t[-1][0], "embeddings.word_embeddings.weight")

    def test_written_file_round_trips(self):
        with tempfile.TemporaryDirectory() as d:
            path, n, nbytes = run.write_workload("resnet50", d)
            with open(path) as f:
                lines = [l.split() for l in f if not l.startswith("#")]
            self.assertEqual(len(lines), n)
            self.assertEqual(4 * sum(int(c) for _, c in lines), nbytes)


class Theory(unittest.TestCase):
    def test_tcp_efficiency(self):
        self.assertAlmostEqual(run.tcp_efficiency(1500), 1448 / 1514)
        self.assertAlmostEqual(run.tcp_efficiency(9000), 8948 / 9014)

    def test_ring_and_spares(self):
        b = 500e6 / 8 * run.TCP_EFFICIENCY
        m = 64 << 20
        self.assertAlmostEqual(run.theory_seconds(m, 4, 0, 500), 1.5 * m / b)   # 2(n-1)/n M/B
        self.assertAlmostEqual(run.theory_seconds(m, 4, 4, 500), m / b)         # D = 24: M/B
        self.assertAlmostEqual(run.theory_seconds(m, 4, 9, 500), m / b)         # k > n is k = n

    def test_spares_in_plan_counts_servers_that_are_not_workers(self):
        # As `tributary create-job --json` prints a job (proto field names, defaults included).
        job = ('{"job_id": "j", "plan": {"servers": [{"node_id": "h0", "is_worker": true}, '
               '{"node_id": "h1", "is_worker": true}, {"node_id": "h2", "is_worker": false}, '
               '{"node_id": "h3", "is_worker": false}], "version": "1"}}')
        self.assertEqual(run.spares_in_plan(job), 2)
        self.assertEqual(run.spares_in_plan('{"job_id": "j", "plan": {"servers": []}}'), 0)
        self.assertEqual(run.spares_in_plan('{"job_id": "j"}'), 0)

    def test_run_measured_meters_and_survives_errors(self):
        class Meter:
            def __init__(self):
                self.calls = []
            def start(self):
                self.calls.append("start")
            def stop(self):
                self.calls.append("stop")
                return {0: 50.0}
        meter = Meter()
        self.assertEqual(run.run_measured(meter, lambda w: ({4096: w}, 2), "pp", "row"),
                         ({4096: "row"}, 2, {0: 50.0}))
        self.assertEqual(run.run_measured(meter, lambda: {8: 1}, "gloo"), ({8: 1}, 0, {0: 50.0}))
        def broken():
            raise RuntimeError("peer died")
        self.assertIsNone(run.run_measured(meter, broken, "mpi"))
        self.assertEqual(meter.calls, ["start", "stop"] * 3)  # The meter stops on errors too.

    def test_suite_algorithms_have_cli_names(self):
        self.assertEqual(run.CLI_ALGORITHM["hd"], "halving-doubling")
        self.assertEqual(run.CLI_ALGORITHM["push-pull"], "push-pull")
        self.assertEqual(run.CLI_ALGORITHM["ring"], "ring")

    def test_message_steps(self):
        self.assertEqual(run.message_steps("tributary ring", 4, 0), 6)
        self.assertEqual(run.message_steps("tributary halving-doubling", 4, 0), 4)
        self.assertEqual(run.message_steps("tributary halving-doubling", 6, 0), 6)
        self.assertEqual(run.message_steps("push/pull", 4, 4), 14)


def row(config, size, us, k=0):
    fam = "gloo" if config.startswith("Gloo") else "tributary"
    return dict(config=config, family=fam, k=k, spares_used=k, size=size, time_us=us, algbw=0,
                busbw=0, wrong=0, cpu={0: 10.0})


class Reports(unittest.TestCase):
    def test_calibration_crossovers_and_alpha(self):
        K, M = 1 << 10, 1 << 20
        results = []
        for s, ring, hd, pp in ((4 * K, 1200, 900, 2000), (64 * K, 1800, 1700, 4000),
                                (1 * M, 27000, 29000, 30000), (16 * M, 420000, 480000, 330000),
                                (64 * M, 1700000, 1850000, 1250000)):
            results += [row("tributary ring", s, ring), row("tributary halving-doubling", s, hd),
                        row("tributary push/pull k=4", s, pp, k=4)]
        with tempfile.TemporaryDirectory() as d:
            lines = run.calibration(results, 4, 500, d)
            import json
            with open(os.path.join(d, "selector_calibration.json")) as f:
                cal = json.load(f)
        self.assertEqual(cal["ring_beats_halving_doubling_from"], 1 * M)
        self.assertEqual(cal["push_pull_beats_ring_from"], {"k=4": 16 * M})
        # Ring: the median over 4 and 64 KiB of (time - bandwidth term) / 6 messages.
        b = 500e6 / 8 * run.TCP_EFFICIENCY
        want = ((1200e-6 - 1.5 * 4 * K / b) / 6 + (1800e-6 - 1.5 * 64 * K / b) / 6) / 2
        self.assertAlmostEqual(cal["alpha_seconds"]["tributary ring"], want, places=6)
        self.assertIn("ring beats halving-doubling from 1 MiB", lines[0])

    def test_spare_report_compares_with_ring_and_theory(self):
        M = 1 << 20
        results = [row("tributary ring", 64 * M, 1500000),
                   row("tributary push/pull k=4", 64 * M, 1000000, k=4)]
        lines = run.spare_report(results, 4)
        self.assertTrue(any("| 64 MiB | 1.50x (1.50x) |" in l for l in lines), lines)

    def test_targets_say_by_how_much(self):
        M = 1 << 20
        results = [row("Gloo ring", 64 * M, 1700000), row("tributary push/pull k=4", 64 * M,
                                                         1360000, k=4),
                   row("tributary push/pull k=0", 64 * M, 1800000)]
        for r in results:
            r["vs_best_peer"] = 1700000 / r["time_us"]
            r["theory_us"] = run.theory_seconds(64 * M, 4, r["k"], 500) * 1e6
            r["best_peer"] = "Gloo ring"
        out = "\n".join(run.targets(results, {64 * M: results[0]}))
        self.assertIn("k=4 >= 1.45x best peer at 64 MiB: MISSED (1.25x vs Gloo ring, 0.20x short)",
                      out)
        self.assertIn("k=0 >= best peer from 16 MiB: MISSED (worst 0.94x at 64 MiB, 6% short)", out)


if __name__ == "__main__":
    unittest.main()
