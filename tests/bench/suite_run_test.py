#!/usr/bin/python3
"""Unit tests of bench/suite/run.py's pure parts: the model workloads, the theory, the repeats'
order and aggregation, the plain-TCP ceiling's patterns and math (and its endpoints, on
loopback), the reports and the CSVs they are rebuilt from. No root, no namespaces."""
import contextlib
import csv
import importlib.util
import io
import os
import sys
import tempfile
import types
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


    def test_workload_iters_override_and_reject_bad_items(self):
        import argparse

        class Parser(argparse.ArgumentParser):
            def error(self, message):
                raise ValueError(message)

        ap = Parser()
        self.assertEqual(run.parse_workload_iters(ap, ["bert-large=1:1", "resnet50=5"]),
                         {"bert-large": (1, 1), "resnet50": (5, run.WORKLOADS["resnet50"][2])})
        for bad, says in (("bert=1", "NAME one of"), ("bert-large", "NAME=TIMED"),
                          ("resnet50=x", "integers"), ("resnet50=0:1", "at least 1"),
                          ("resnet50=2:-1", "warm-up >= 0")):
            with self.assertRaises(ValueError) as e:
                run.parse_workload_iters(ap, [bad])
            self.assertIn(says, str(e.exception), bad)


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
        got = run.run_measured(meter, lambda w: ({4096: w}, 2), "pp", "row")
        self.assertEqual(got[:3], ({4096: "row"}, 2, {0: 50.0}))
        self.assertGreaterEqual(got[3], 0.0)  # wall seconds, to weight CPU over repeats
        self.assertEqual(run.run_measured(meter, lambda: {8: 1}, "gloo")[:3],
                         ({8: 1}, 0, {0: 50.0}))
        def broken():
            raise RuntimeError("peer died")
        self.assertIsNone(run.run_measured(meter, broken, "mpi"))
        self.assertEqual(meter.calls, ["start", "stop"] * 3)  # The meter stops on errors too.

    def test_cpu_meter_interpolates_a_window_between_its_samples(self):
        meter = run.CpuMeter([0, 1])
        meter.timeline = [(10.0, {0: 0.0, 1: 0.0}), (11.0, {0: 0.5, 1: 0.1}),
                          (12.0, {0: 1.5, 1: 0.1}), (13.0, {0: 1.5, 1: 0.4})]
        got = meter.between(10.5, 12.5)
        self.assertAlmostEqual(got[0], 1.5 - 0.25)
        self.assertAlmostEqual(got[1], 0.25 - 0.05)
        self.assertEqual(meter.between(11.0, 12.0), {0: 1.0, 1: 0.0})
        self.assertIsNone(meter.between(9.0, 12.0))   # before the first sample
        self.assertIsNone(meter.between(12.0, 13.5))  # after the last
        self.assertIsNone(meter.between(12.0, 11.0))

    def test_workload_result_carries_the_timed_window(self):
        out = ("# x\n# resnet50 iterations (ms, 1 warm-up first): 9000 7400.5\n"
               "WCSV,resnet50,161,102,7400000.000,0\nWTIMED,100.250000,130.500000\n")
        self.assertEqual(run.parse_wcsv(out), {"tensors": 161, "bytes": 102,
                                               "time_us": 7400000.0, "wrong": 0,
                                               "timed": (100.25, 130.5),
                                               "iterations_ms": [9000.0, 7400.5]})
        self.assertNotIn("timed", run.parse_wcsv("WCSV,resnet50,161,102,7400000.000,0\n"))
        self.assertIsNone(run.parse_wcsv("WTIMED,1,2\n"))

    def test_torch_result_carries_the_timed_window(self):
        out = "TORCHITER,tributary,4,8137.0,1568.0,6569.0,3,0\nWTIMED,5.5,30.25\n"
        got = run.parse_torch_line(out)
        self.assertEqual((got["iter_ms"], got["iters"], got["timed"]), (8137.0, 3, (5.5, 30.25)))
        self.assertNotIn("timed", run.parse_torch_line(out.splitlines()[0]))
        self.assertIsNone(run.parse_torch_line("WTIMED,1,2\n"))

    def test_torch_configs(self):
        args = types.SimpleNamespace(k=[0, 2, 4], torch_overlap_forward=False,
                                     torch_layer_priorities=False)
        self.assertEqual([c[0] for c in run.torch_configs(args)],
                         ["tributary.torch k=0", "tributary.torch k=4",
                          "PyTorch DDP + tributary k=0", "PyTorch DDP + tributary k=4",
                          "PyTorch DDP + Gloo"])
        args.torch_overlap_forward = args.torch_layer_priorities = True
        configs = {c[0]: c[1:] for c in run.torch_configs(args)}
        # (k, overlap_forward, DDP over tributary, layer priorities)
        self.assertEqual(configs["tributary.torch k=4 overlap"], (4, True, False, False))
        self.assertEqual(configs["tributary.torch k=4 layer priorities"], (4, False, False, True))
        self.assertEqual(configs["tributary.torch k=4"], (4, False, False, False))
        self.assertEqual(configs["PyTorch DDP + tributary k=0"], (0, False, True, False))
        self.assertEqual(configs["PyTorch DDP + Gloo"], (None, False, False, False))
        # --torch-only keeps the configurations it names, in run order.
        args.torch_only = ["PyTorch DDP + tributary k=4", "tributary.torch k=4 layer priorities"]
        self.assertEqual([c[0] for c in run.torch_configs(args)],
                         ["tributary.torch k=4 layer priorities", "PyTorch DDP + tributary k=4"])
        args.torch_only = ["tributary.torch k=2"]
        with self.assertRaisesRegex(ValueError, "k=2.*no such configuration"):
            run.torch_configs(args)

    def test_torch_report_compares_metered_cpu_with_ddp(self):
        args = types.SimpleNamespace(torch_iterations="resnet50", workers=4,
                                     torch_algorithm="auto")
        rows = [dict(config="tributary.torch k=4", k=4, spares_used=4, repeats=3,
                     iter_ms=8000.0, compute_ms=1500.0, comm_ms=6500.0, comm_spread=5.0,
                     cpu="29 30 29 30 3 3 3 3", timed_cpu_ms=2100.0),
                dict(config="PyTorch DDP + Gloo", k=None, spares_used=0, repeats=3,
                     iter_ms=11000.0, compute_ms=1600.0, comm_ms=9400.0, comm_spread=4.0,
                     cpu="16 16 16 17 0 0 0 0", timed_cpu_ms=2000.0)]
        with tempfile.TemporaryDirectory() as out:
            lines = run.torch_report(rows, args, out)
            with open(os.path.join(out, "torch_iterations.csv")) as f:
                saved = list(csv.DictReader(f))
        self.assertIn("| 2100 | 1.05x |", lines[-2])
        self.assertIn("| 2000 | 1.00x |", lines[-1])
        self.assertEqual(saved[0]["worker_cpu_ms_timed"], "2100.0")

    def test_bench_rank_gets_the_extra_arguments(self):
        args = types.SimpleNamespace(workers=2, k=[0, 1], bench_rank_arg=["--trace", "x"])
        suite = run.Suite(args, {}, "bin", "work")
        extra = suite.extra_bench_rank_args("ring", 0, run.Band("4096", 10))
        self.assertEqual(extra, ["--trace", "x"])
        extra.append("--oops")                    # a copy: one run cannot change the next
        self.assertEqual(suite.extra_bench_rank_args("ring", 0, None), ["--trace", "x"])

    def test_bucket_configs_run_workloads_in_ddp_buckets_and_skip_the_sweep(self):
        args = types.SimpleNamespace(workers=2, k=[0, 4], bench_rank_arg=["--trace", "x"])
        suite = run.Suite(args, {}, "bin", "work")
        configs = run.build_configs(
            suite, ["pp", "pp-buckets", "trib-ring-buckets", "trib-auto-buckets"], {})
        self.assertEqual([c[0] for c in configs], [
            "tributary push/pull k=0", "tributary push/pull k=4",
            "tributary push/pull k=0 DDP buckets", "tributary push/pull k=4 DDP buckets",
            "tributary ring DDP buckets",
            "tributary auto k=0 DDP buckets", "tributary auto k=4 DDP buckets"])
        self.assertEqual([c[0] for c in run.sweep_configs(configs)],
                         ["tributary push/pull k=0", "tributary push/pull k=4"])
        workload = run.Workload("resnet50", "r.tensors", 3, 1, 100)
        self.assertEqual(suite.extra_bench_rank_args("auto", 4, workload, buckets=True),
                         ["--bucket-bytes", str(25 << 20), "--trace", "x"])
        self.assertEqual(suite.extra_bench_rank_args("auto", 4, workload), ["--trace", "x"])
        self.assertEqual(suite.extra_bench_rank_args("auto", 4, run.Band("4096", 10), True),
                         ["--trace", "x"])
        # Their traffic is push/pull's (with spares) or the ring's.
        self.assertEqual(run.pattern_for("tributary auto k=4 DDP buckets", 4), "push/pull 4 spares")
        self.assertEqual(run.pattern_for("tributary ring DDP buckets", 0), "ring")
        self.assertEqual([run.config_k(c[0]) for c in configs], [0, 4, 0, 4, 0, 0, 4])
        self.assertEqual(run.config_k("tributary push/pull k=4 no fusion"), 4)
        self.assertEqual(run.config_k("Gloo ring"), 0)

    def test_bands_give_small_sizes_many_iterations_and_large_ones_few(self):
        args = types.SimpleNamespace(workers=2, k=[0], sizes="4K:64M", small_upto="16K",
                                     small_iters=200, iters=10, large_from="16M", large_iters=2)
        bands = run.Suite(args, {}, "bin", "work").bands()
        self.assertEqual([(b.sizes.split(",")[0], b.sizes.split(",")[-1], b.iters)
                          for b in bands],
                         [("4096", "16384", 200), ("32768", "8388608", 10),
                          ("16777216", "67108864", 2)])
        args.sizes = "1M:64M"  # the main job's sweep: no small band
        self.assertEqual([b.iters for b in run.Suite(args, {}, "bin", "work").bands()], [10, 2])

    def test_suite_algorithms_have_cli_names(self):
        self.assertEqual(run.CLI_ALGORITHM["hd"], "halving-doubling")
        self.assertEqual(run.CLI_ALGORITHM["rd"], "recursive-doubling")
        self.assertEqual(run.CLI_ALGORITHM["push-pull"], "push-pull")
        self.assertEqual(run.CLI_ALGORITHM["ring"], "ring")

    def test_message_steps(self):
        self.assertEqual(run.message_steps("tributary ring", 4, 0), 6)
        self.assertEqual(run.message_steps("tributary halving-doubling", 4, 0), 4)
        self.assertEqual(run.message_steps("tributary halving-doubling", 6, 0), 6)
        self.assertEqual(run.message_steps("tributary recursive doubling", 8, 0), 3)
        self.assertEqual(run.message_steps("tributary recursive doubling", 6, 0), 4)
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
        self.assertNotIn("recursive_doubling_below", cal)  # it did not run

    def test_recursive_doubling_threshold(self):
        K = 1 << 10
        def results(rd_times):
            out = []
            for s, rd in zip((4 * K, 8 * K, 16 * K), rd_times):
                out += [row("tributary ring", s, 1000), row("tributary halving-doubling", s, 900),
                        row("tributary recursive doubling", s, rd)]
            return out
        self.assertEqual(run.recursive_doubling_below(results((500, 800, 950))), 16 * K)
        self.assertEqual(run.recursive_doubling_below(results((950, 800, 950))), 0)
        self.assertEqual(run.recursive_doubling_below(results((500, 800, 850))), 16 * K + 1)
        self.assertIsNone(run.recursive_doubling_below([row("tributary ring", 4 * K, 1)]))
        with tempfile.TemporaryDirectory() as d:
            lines = run.calibration(results((500, 800, 950)), 4, 500, d)
            import json
            with open(os.path.join(d, "selector_calibration.json")) as f:
                self.assertEqual(json.load(f)["recursive_doubling_below"], 16 * K)
        self.assertIn("recursive doubling fastest below 16 KiB", lines[0])

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
        results[1]["efficiency_vs_ceiling"] = 0.95
        results[2]["efficiency_vs_ceiling"] = 0.85
        out = "\n".join(run.targets(results, {64 * M: results[0]}))
        self.assertIn("k=4 >= 1.40x best peer at 64 MiB: MISSED (1.25x vs Gloo ring, 0.15x short)",
                      out)
        self.assertIn("within 10% of the plain-TCP ceiling of its pattern from 16 MiB: MISSED in 1 "
                      "of 2 rows", out)
        self.assertIn("tributary push/pull k=0 64 MiB: 0.85 of the ceiling", out)
        self.assertIn("k=0 >= best peer from 16 MiB: MISSED (worst 0.94x at 64 MiB, 6% short)", out)

    def test_latency_target_is_against_open_mpi_ring(self):
        K = 1 << 10
        results = [dict(row("Open MPI ring", 4 * K, 200), family="mpi"),
                   dict(row("Open MPI default", 4 * K, 60), family="mpi"),
                   row("tributary ring", 4 * K, 400), row("tributary recursive doubling", 4 * K, 250)]
        out = "\n".join(run.targets(results, {4 * K: results[1]}))
        self.assertIn("4 KiB latency <= 1.5x Open MPI ring's (200 us): MET by the fastest Tributary "
                      "algorithm, tributary recursive doubling (250 us, 1.25x)", out)
        self.assertIn("tributary ring: 400 us (2.00x)", out)


class Repeats(unittest.TestCase):
    def test_runs_are_interleaved_round_robin(self):
        order = run.interleave(["A", "B", "C"], 3)
        self.assertEqual([u for _, u in order], ["A", "B", "C"] * 3)
        self.assertEqual([rep for rep, _ in order], [0, 0, 0, 1, 1, 1, 2, 2, 2])
        self.assertEqual(run.interleave(["A", "B"], 1), [(0, "A"), (0, "B")])

    def test_time_stats_median_and_spread(self):
        st = run.time_stats([110.0, 100.0, 130.0])
        self.assertEqual((st["time_us"], st["time_min_us"], st["time_max_us"]), (110, 100, 130))
        self.assertAlmostEqual(st["spread_pct"], 100 * 30 / 110)
        self.assertEqual(st["repeats"], 3)
        self.assertEqual(run.time_stats([100.0, 120.0])["time_us"], 110.0)  # even: the middle
        self.assertEqual(run.time_stats([100.0])["spread_pct"], 0.0)

    def test_cpu_is_weighted_by_each_runs_wall_time(self):
        cpu = run.mean_cpu([({0: 50.0, 1: 10.0}, 1.0), ({0: 20.0, 1: 10.0}, 3.0)])
        self.assertAlmostEqual(cpu[0], (50 + 60) / 4)
        self.assertAlmostEqual(cpu[1], 10.0)

    def test_aggregate_sweep_reports_medians_per_config_and_size(self):
        K, n = 1 << 10, 4
        samples = []
        # Three interleaved repeats of two configs at two sizes; Gloo's second run is slow.
        for rep, (ring_t, gloo_t) in enumerate(((100.0, 90.0), (104.0, 400.0), (96.0, 92.0))):
            for size, mult in ((4 * K, 1), (8 * K, 2)):
                samples.append(dict(row("tributary ring", size, ring_t * mult), wrong=rep))
                samples.append(row("Gloo ring", size, gloo_t * mult))
        cpu = {"tributary ring": [({0: 30.0}, 1.0), ({0: 60.0}, 2.0)]}
        rows = run.aggregate_sweep(samples, cpu, n)
        self.assertEqual([(r["config"], r["size"]) for r in rows],
                         [("tributary ring", 4 * K), ("Gloo ring", 4 * K),
                          ("tributary ring", 8 * K), ("Gloo ring", 8 * K)])
        ring4, gloo4, ring8 = rows[0], rows[1], rows[2]
        self.assertEqual(ring4["time_us"], 100.0)
        self.assertEqual(gloo4["time_us"], 92.0)                      # the outlier is not it
        self.assertEqual((gloo4["time_min_us"], gloo4["time_max_us"]), (90.0, 400.0))
        self.assertAlmostEqual(gloo4["spread_pct"], 100 * 310 / 92)
        self.assertEqual(ring8["times_us"], [200.0, 208.0, 192.0])  # in run order
        self.assertEqual(ring4["wrong"], 0 + 1 + 2)                  # every repeat's errors
        self.assertAlmostEqual(ring4["algbw"], 4 * K / 100.0 / 1e3)  # from the median
        self.assertAlmostEqual(ring4["busbw"], ring4["algbw"] * 1.5)
        self.assertAlmostEqual(ring4["cpu"][0], 50.0)
        self.assertEqual(gloo4["cpu"], {0: 10.0})                    # no meter samples: the run's

    def test_aggregate_workloads(self):
        samples = [dict(row("Gloo ring", 0, t), workload="resnet50", tensors=161, bytes=1000,
                        wall_s=1.0) for t in (300.0, 100.0, 200.0)]
        (w,) = run.aggregate_workloads(samples)
        self.assertEqual((w["workload"], w["time_us"], w["repeats"]), ("resnet50", 200.0, 3))
        self.assertEqual((w["tensors"], w["bytes"]), (161, 1000))

    def test_aggregate_workloads_takes_the_median_of_metered_cpu(self):
        samples = [dict(row("Gloo ring", 0, t), workload="resnet50", tensors=161, bytes=1000,
                        wall_s=1.0, timed_cpu_ms=c)
                   for t, c in ((300.0, 700.0), (100.0, None), (200.0, 600.0))]
        (w,) = run.aggregate_workloads(samples)
        self.assertEqual(w["timed_cpu_ms"], 650.0)  # the runs that reported their window
        for r in samples:
            r["timed_cpu_ms"] = None
        self.assertIsNone(run.aggregate_workloads(samples)[0]["timed_cpu_ms"])

    def test_every_ratio_is_of_medians(self):
        M = 1 << 20
        samples = []
        for ring_t, gloo_t in ((1.00e6, 1.2e6), (1.10e6, 1.0e6), (3.00e6, 1.1e6)):
            samples += [row("tributary ring", 64 * M, ring_t), row("Gloo ring", 64 * M, gloo_t)]
        results = run.aggregate_sweep(samples, {}, 4)
        run.annotate(results, 4, 500, {})
        ring = results[0]
        self.assertEqual(ring["time_us"], 1.1e6)                     # not the mean, 1.7e6
        self.assertAlmostEqual(ring["vs_best_peer"], 1.1e6 / 1.1e6)
        self.assertAlmostEqual(ring["efficiency"],
                               run.theory_seconds(64 * M, 4, 0, 500) * 1e6 / 1.1e6)
        self.assertIsNone(ring["ceiling_us"])                        # no ceiling measured


class Ceiling(unittest.TestCase):
    def test_ring_and_halving_doubling_patterns(self):
        self.assertEqual(run.ring_flows(3), [(0, 1, 4 / 3), (1, 2, 4 / 3), (2, 0, 4 / 3)])
        self.assertAlmostEqual(run.bottleneck_unit(run.ring_flows(4)), 1.5)
        self.assertEqual(sorted((s, d) for s, d, _ in run.hd_flows(4)),
                         [(0, 1), (1, 0), (2, 3), (3, 2)])
        self.assertEqual(sorted((s, d) for s, d, _ in run.hd_flows(3)), [(0, 1), (1, 0)])
        self.assertAlmostEqual(run.bottleneck_unit(run.hd_flows(4)), 1.5)
        self.assertAlmostEqual(run.bottleneck_unit(run.rd_flows(4)), 2)
        self.assertAlmostEqual(run.bottleneck_unit(run.rd_flows(8)), 3)
        self.assertAlmostEqual(run.bottleneck_unit(run.rd_flows(6)), 4)
        self.assertEqual(run.pattern_for("tributary recursive doubling", 0), "recursive doubling")
        # The agent's own choice: push/pull's pattern when its plan has spares, else ring's.
        self.assertEqual(run.pattern_for("tributary auto k=4", 4), "push/pull 4 spares")
        self.assertEqual(run.pattern_for("tributary auto k=0", 0), "ring")

    def test_push_pull_pattern_of_the_models_shares_moves_the_models_bytes(self):
        # DESIGN.md §1.1: worker servers own (n-k)/D, spares 2(n-1)/D; the busiest host moves
        # 2n(n-1)/D of the tensor, which is what the model's time charges.
        for n, k in ((4, 0), (4, 1), (4, 2), (4, 4), (2, 1), (8, 0)):
            d = n * n + k * n - 2 * k
            servers = {h: (n - k) / d for h in range(n)}
            servers.update({n + j: 2 * (n - 1) / d for j in range(k)})
            flows = run.push_pull_flows(n, {h: s for h, s in servers.items() if s > 0})
            self.assertAlmostEqual(run.bottleneck_unit(flows), 2 * n * (n - 1) / d,
                                   msg=f"n={n} k={k}")
        # Both ways at once, never to itself: 2 workers, 1 spare.
        flows = run.push_pull_flows(2, {0: 0.25, 1: 0.25, 2: 0.5})
        self.assertIn((0, 2, 0.5), flows)
        self.assertIn((2, 0, 0.5), flows)
        self.assertNotIn((0, 0, 0.25), flows)
        self.assertEqual(len(flows), 8)

    def test_servers_in_plan(self):
        job = ('{"plan": {"servers": [{"node_id": "h0", "is_worker": true, "share": 0.25}, '
               '{"node_id": "h1", "is_worker": true, "share": 0.25}, '
               '{"node_id": "h2", "is_worker": false, "share": 0.5}, '
               '{"node_id": "h3", "is_worker": false, "share": 0}]}}')
        self.assertEqual(run.servers_in_plan(job), {0: 0.25, 1: 0.25, 2: 0.5})
        self.assertEqual(run.servers_in_plan('{"job_id": "j"}'), {})

    def test_patterns_of_configs(self):
        self.assertEqual(run.pattern_for("tributary push/pull k=4", 4), "push/pull 4 spares")
        self.assertEqual(run.pattern_for("tributary push/pull k=2", 1), "push/pull 1 spares")
        for c in ("tributary ring", "Gloo ring", "Open MPI ring", "Open MPI default"):
            self.assertEqual(run.pattern_for(c, 0), "ring")
        for c in ("tributary halving-doubling", "Gloo halving-doubling"):
            self.assertEqual(run.pattern_for(c, 0), "halving-doubling")

    def test_time_and_efficiency_at_the_ceiling(self):
        M = 1 << 20
        b = run.model_rate(500)
        ceilings = {"ring": run.ceiling_summary("ring", run.ring_flows(4),
                                                [0.95 * b, 0.90 * b, 0.99 * b])}
        self.assertAlmostEqual(ceilings["ring"]["rate"], 0.95 * b)   # median of the probes
        r = row("Gloo ring", 64 * M, 2.0e6)
        run.add_ceiling(r, ceilings, 64 * M, 500)
        model_us = run.theory_seconds(64 * M, 4, 0, 500) * 1e6
        self.assertAlmostEqual(r["ceiling_us"], model_us / 0.95)     # 1.5 M / (0.95 B)
        self.assertAlmostEqual(r["efficiency_vs_ceiling"], model_us / 0.95 / 2.0e6)
        self.assertAlmostEqual(r["ceiling_vs_model_rate"], 0.95)
        self.assertEqual(r["ceiling_pattern"], "ring")
        hd = row("Gloo halving-doubling", 64 * M, 2.0e6)
        run.add_ceiling(hd, ceilings, 64 * M, 500)                   # not measured
        self.assertIsNone(hd["ceiling_us"])
        # Push/pull with 4 spares: the busiest host moves M (not 1.5 M).
        pp = run.push_pull_flows(4, {4: 0.25, 5: 0.25, 6: 0.25, 7: 0.25})
        ceilings["push/pull 4 spares"] = run.ceiling_summary("push/pull 4 spares", pp, [0.8 * b])
        r = row("tributary push/pull k=4", 64 * M, 2.0e6, k=4)
        run.add_ceiling(r, ceilings, 64 * M, 500)
        self.assertAlmostEqual(r["ceiling_us"], 64 * M / (0.8 * b) * 1e6)

    def test_probe_on_loopback_moves_every_byte(self):
        # The endpoints as the suite runs them in the namespaces, here on 127.0.0.x: the busiest
        # host moves host_bytes; the probe checks that every byte sent was received.
        flows = run.push_pull_flows(2, {0: 0.25, 1: 0.25, 2: 0.5})
        rate = run.probe_tcp(flows, 4 << 20, lambda h: [], lambda h: f"127.0.0.{h + 1}",
                             streams=2, timeout=60)
        self.assertGreater(rate, 0)

    def test_probe_with_a_named_congestion_control(self):
        # The senders' sockets run the named congestion control (reno: in every kernel, allowed
        # to everyone); one the kernel lacks is the endpoint's error, naming the host.
        rate = run.probe_tcp(run.ring_flows(2), 1 << 20, lambda h: [],
                             lambda h: f"127.0.0.{h + 1}", timeout=60, congestion="reno")
        self.assertGreater(rate, 0)
        with self.assertRaisesRegex(RuntimeError, "127.0.0.*TCP_CONGESTION nosuchcc"):
            run.probe_tcp(run.ring_flows(2), 1 << 20, lambda h: [],
                          lambda h: f"127.0.0.{h + 1}", timeout=60, congestion="nosuchcc")

    def test_the_ceiling_is_the_congestion_control_with_the_highest_median(self):
        b = run.model_rate(125)
        c = run.ceiling_summary("ring", run.ring_flows(4),
                                {"system": [0.90 * b, 0.99 * b, 0.91 * b],
                                 "cubic": [0.95 * b, 0.94 * b, 0.96 * b], "reno": []})
        self.assertEqual(c["congestion"], "cubic")
        self.assertAlmostEqual(c["rate"], 0.95 * b)
        self.assertEqual(sorted(c["by_congestion"]), ["cubic", "system"])  # unprobed: left out
        old = run.ceiling_summary("ring", run.ring_flows(4), [0.9 * b])   # a list: the host's
        self.assertEqual((old["congestion"], old["rate"]), ("system", 0.9 * b))
        self.assertEqual(run.ceiling_congestions(" system, cubic,cubic,"), ["system", "cubic"])
        self.assertEqual(run.ceiling_congestions(""), ["system"])

    def test_a_ceiling_csv_without_the_congestion_columns_loads_as_the_hosts(self):
        # emulated_ceiling.csv of a run before --ceiling-congestion: its probes are the host's.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "emulated_ceiling.csv")
            with open(path, "w") as f:
                f.write("pattern,flows,bytes_per_tensor_byte,rate_mbit_per_host,rate_vs_model,"
                        "probes_bytes_per_s\nring,4,1.5,121.5,0.9804,15300000.0 15200000.0\n")
            c = run.load_ceilings(path)["ring"]
            self.assertEqual((c["congestion"], c["by_congestion"]),
                             ("system", {"system": [15300000.0, 15200000.0]}))
            self.assertAlmostEqual(c["rate"], 15250000.0)
            self.assertIn("| ring | 4 | 1.500 | 122 | ", "\n".join(run.ceiling_report(
                {"ring": c}, 125)))

    def test_probe_reports_an_endpoint_that_cannot_listen(self):
        with self.assertRaisesRegex(RuntimeError, "192.0.2.1"):   # TEST-NET-1: not ours
            run.probe_tcp(run.ring_flows(2), 1 << 20, lambda h: [],
                          lambda h: "127.0.0.1" if h == 0 else "192.0.2.1", timeout=60)


OLD_SWEEP_HEADER = ["config", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "wrong",
                    "theory_us", "efficiency", "speedup_vs_best_peer", "best_peer",
                    "spares_used", "cpu_pct_per_host"]
OLD_WORKLOAD_HEADER = ["workload", "config", "tensors", "bytes", "time_us", "theory_us",
                       "efficiency", "speedup_vs_best_peer", "best_peer", "spares_used",
                       "cpu_pct_per_host", "wrong"]


class Csvs(unittest.TestCase):
    ARGS = types.SimpleNamespace(workers=4, rate=500, mtu=9000, k=[0, 4], small_iters=200,
                                 small_upto="64K", iters=10, large_from="16M", large_iters=2,
                                 warmup=1)

    def report(self, results, out, wresults, ceilings):
        with contextlib.redirect_stdout(io.StringIO()):  # it prints the tables
            run.report(results, self.ARGS, out, "", False, wresults, ceilings)

    def write(self, path, header, rows):
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)

    def test_workloads_alone_are_reported(self):
        with tempfile.TemporaryDirectory() as old, tempfile.TemporaryDirectory() as out:
            self.write(os.path.join(old, "emulated_workloads.csv"), OLD_WORKLOAD_HEADER, [
                ["bert-large", "Gloo ring", 391, 1340567552, "138451165.6", "129644000.0",
                 "0.94", "1.000", "Gloo ring", 0, "7 7 6 7 0 0 0 0", 0]])
            wl = run.load_workloads(os.path.join(old, "emulated_workloads.csv"))
            self.report([], out, wl, {})  # an empty --sizes: no sweep
            with open(os.path.join(out, "emulated_allreduce.md")) as f:
                md = f.read()
            self.assertIn("| bert-large | Gloo ring |", md)
            self.assertNotIn("| config | size |", md)
            self.assertFalse(os.path.exists(os.path.join(out, "emulated_allreduce.png")))

    def test_old_csvs_without_repeats_still_load_and_rebuild(self):
        M = 1 << 20
        with tempfile.TemporaryDirectory() as old, tempfile.TemporaryDirectory() as out:
            self.write(os.path.join(old, "emulated_allreduce.csv"), OLD_SWEEP_HEADER, [
                ["tributary push/pull k=4", 64 * M, "1380898.0", "0.0486", "0.0729", 0,
                 "1081662.0", "0.783", "1.204", "Gloo ring", 4, "20 19 19 20 16 16 15 16"],
                ["Gloo ring", 64 * M, "1662502.0", "0.0404", "0.0605", 0, "1622493.0", "0.976",
                 "1.000", "Gloo ring", 0, "22 22 22 22 1 1 1 1"]])
            self.write(os.path.join(old, "emulated_workloads.csv"), OLD_WORKLOAD_HEADER, [
                ["resnet50", "Gloo ring", 161, 102227968, "2536000.0", "2472000.0", "0.975",
                 "1.000", "Gloo ring", 0, "23 23 23 23 1 1 1 1", 0]])
            results = run.merge([], os.path.join(old, "emulated_allreduce.csv"))
            self.assertEqual(len(results), 2)
            pp = results[0]
            self.assertEqual((pp["time_us"], pp["repeats"], pp["spread_pct"], pp["times_us"]),
                             (1380898.0, 1, 0.0, [1380898.0]))
            self.assertNotIn("ceiling_us", pp)
            wl = run.load_workloads(os.path.join(old, "emulated_workloads.csv"))
            self.assertEqual((wl[0]["time_us"], wl[0]["repeats"]), (2536000.0, 1))
            self.assertEqual(run.load_ceilings(os.path.join(old, "emulated_ceiling.csv")), {})
            self.report(results, out, wl, {})
            with open(os.path.join(out, "emulated_allreduce.md")) as f:
                md = f.read()
            self.assertIn("Times are of one run", md)
            self.assertIn("| Gloo ring | 64 MiB | 1662502 | - |", md)
            self.assertAlmostEqual(results[0]["vs_best_peer"], 1662502 / 1380898)

    def test_new_csvs_round_trip_with_repeats_and_ceiling(self):
        M = 1 << 20
        b = run.model_rate(500)
        samples = [row("Gloo ring", 64 * M, t) for t in (1.70e6, 1.66e6, 1.75e6)]
        samples += [row("tributary push/pull k=4", 64 * M, t, k=4) for t in (1.4e6, 1.3e6)]
        results = run.aggregate_sweep(samples, {}, 4)
        ceilings = {
            # The host's default and cubic probed; cubic's median is the higher, so it counts.
            "ring": run.ceiling_summary("ring", run.ring_flows(4),
                                        {"system": [0.96 * b, 0.95 * b],
                                         "cubic": [0.97 * b, 0.98 * b]}),
            "push/pull 4 spares": run.ceiling_summary(
                "push/pull 4 spares", run.push_pull_flows(4, {h: 0.25 for h in range(4, 8)}),
                [0.92 * b])}
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as again:
            self.report(results, out, [], ceilings)
            with open(os.path.join(out, "emulated_allreduce.md")) as f:
                md = f.read()
            self.assertIn("median of 3 runs", md)
            self.assertIn("| push/pull 4 spares | 32 | 1.000 | ", md)
            self.assertIn("| cubic | system: 476 472; cubic: 481 486 |", md)
            with open(os.path.join(out, "emulated_allreduce.csv")) as f:
                rows = {r["config"]: r for r in csv.DictReader(f)}
            gloo = rows["Gloo ring"]
            self.assertEqual((float(gloo["time_us"]), gloo["repeats"], gloo["times_us"]),
                             (1.70e6, "3", "1700000.0 1660000.0 1750000.0"))
            self.assertAlmostEqual(float(gloo["spread_pct"]), 100 * 0.09 / 1.70, places=2)
            want = run.theory_seconds(64 * M, 4, 0, 500) * 1e6 / 0.975
            self.assertAlmostEqual(float(gloo["ceiling_us"]), want, delta=0.1)
            self.assertAlmostEqual(float(gloo["efficiency_vs_ceiling"]), want / 1.70e6,
                                   places=3)
            # Rebuilt from the CSVs (--from-results): the same medians, spreads and ceilings.
            loaded = run.merge([], os.path.join(out, "emulated_allreduce.csv"))
            again_ceilings = run.load_ceilings(os.path.join(out, "emulated_ceiling.csv"))
            self.assertEqual(again_ceilings, ceilings)
            self.report(loaded, again, [], again_ceilings)
            with open(os.path.join(again, "emulated_allreduce.md")) as f:
                self.assertEqual(f.read(), md)
            # Merged into a later run (--merge), a row keeps the ceiling of its own run.
            loaded = run.merge([], os.path.join(out, "emulated_allreduce.csv"))
            other = {"ring": run.ceiling_summary("ring", run.ring_flows(4), [0.5 * b])}
            run.annotate(loaded, 4, 500, other)
            gloo = next(r for r in loaded if r["config"] == "Gloo ring")
            self.assertAlmostEqual(gloo["ceiling_us"], want, delta=0.1)
            self.assertAlmostEqual(gloo["efficiency_vs_ceiling"], gloo["ceiling_us"] / 1.70e6)


if __name__ == "__main__":
    unittest.main()
