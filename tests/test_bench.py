"""Smoke test of the benchmark suite: `bench/run_all.py --quick` completes and writes one
well-formed JSON record per measurement for every benchmark (no timing assertions).

Quick mode is cut to the smallest sizes; what it leaves out of the full measurements, and what
this test therefore accepts: `parallel` has the threads, processes and bare layouts (dask only in full
mode), `startup` one launch (no warm launch, so no cold/warm ratio), and the Prefect flows of
`overhead` and `startup` run against one server: here the test session's (`prefect_server`), so
that the suite starts no temporary Prefect server of its own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT

EXPECTED = {"local_training", "parallel", "overhead", "memory", "evaluation", "evaluation_layouts", "startup",
            "per_sample", "round", "augment"}

# Per benchmark, the figures that must be positive numbers (dotted paths; a mapping: all its values).
POSITIVE = {
    "local_training": ["samples_per_second", "ratio_fedavg_vs_bare", "ratio_fedcme_vs_bare"],
    "parallel": ["samples_per_second", "round_wall_seconds", "speedup_2w_vs_1w", "startup_seconds"],
    "overhead": ["round_seconds", "ideal_seconds", "ratio_flow_vs_ideal", "ratio_threadpool_loop_vs_ideal",
                 "ratio_flow_vs_threadpool_loop", "ratio_flow_vs_serial_loop"],
    "memory": ["peak_rss_mib", "peak_pss_mib", "ratio_2w_vs_1w", "ratio_many_vs_few_clients"],
    "evaluation": ["samples_per_second", "ratio_evaluate_vs_bare"],
    "evaluation_layouts": [f"figures.{model}.{layout}.{figure}" for model in ("fmnist_cnn", "cifar_cnn")
                           for layout in ("nchw", "channels_last, NCHW images", "channels_last, laid-out images")
                           for figure in ("samples_per_second", "largest_batch_that_pays")]
                          + [f"round_calls.{model}.seconds" for model in ("fmnist_cnn", "cifar_cnn")],
    "startup": ["seconds.server_running"],  # one launch against the given server (quick mode)
    "per_sample": ["per_sample_us", "samples_per_second", "ratio_clients_vmap_vs_serial"],
    "augment": ["per_sample_us", "share_of_augmented_step"],
    "round": [f"figures.{variant}.{figure}" for variant in ("defaults", "old", "bare")
              for figure in ("round_seconds", "samples_per_second", "outside_rounds_seconds", "peak_rss_mib")],
}


def figures(record: dict, path: str) -> list:
    value = record
    for key in path.split("."):
        value = value[key]
    return list(value.values()) if isinstance(value, dict) else [value]


def is_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_quick_benchmarks_write_well_formed_results(tmp_path, prefect_server):
    results = tmp_path / "results.jsonl"
    environment = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "MLFLOW_DISABLE_TELEMETRY": "true"}
    environment.pop("PREFECT_API_URL", None)  # only round, overhead and startup get the server (--prefect-api-url)
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "run_all.py"), "--quick", "--jobs", "2", "--results", str(results),
         "--prefect-api-url", prefect_server],
        check=False, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]

    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert {record["bench"] for record in records} == EXPECTED
    assert len(records) >= len(EXPECTED)
    for record in records:
        assert record["quick"] is True
        assert record["machine"] and record["cores"] >= 1 and record["torch"] and record["torch_threads"] >= 1
        for path in POSITIVE[record["bench"]]:
            values = figures(record, path)
            assert values and all(is_positive(value) for value in values), (record["bench"], path, values)
        if record["bench"] == "per_sample":
            diffs = record["max_abs_param_diff"].values()
            assert set(record["max_abs_param_diff"]) >= {"channels_last_vs_plain", "clients_vmap_vs_serial"}
            assert all(math.isfinite(diff) and diff >= 0 for diff in diffs)
        if record["bench"] == "startup":
            assert record["states"] == ["server_running"] and record["until"] == "start"
            assert set(record["seconds"]["server_running"]) == {"first_output", "round_start"}
            assert record["ratio_cold_vs_warm_round_start"] is None  # no warm launch in quick mode
        if record["bench"] in ("startup", "overhead", "round"):
            assert record["prefect_server"] == "shared by the quick suite"
        if record["bench"] == "memory":
            assert set(record["peak_rss_mib"]) == {"w1_K4", "w2_K4", "w2_K40"}
            assert all(summary > 0 for summary in record["run_seconds"].values())
    assert {record["layout"] for record in records if record["bench"] == "parallel"} == {"threads", "processes", "bare"}
    assert {record["model"] for record in records if record["bench"] == "per_sample"} == {"fmnist_cnn", "cifar_cnn"}


def run_bench_without_gpu(script: str, results, *options: str) -> subprocess.CompletedProcess:
    """bench/<script> with no CUDA device visible, writing its records to `results`."""
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "DO_NOT_TRACK": "1"}
    return subprocess.run([sys.executable, str(REPO_ROOT / "bench" / script), "--results", str(results), *options],
                          cwd=results.parent, env=environment, capture_output=True, text=True, timeout=600)


def run_gpu_bench(tmp_path, *options: str) -> subprocess.CompletedProcess:
    return run_bench_without_gpu("gpu.py", tmp_path / "gpu.jsonl", *options)


@pytest.mark.slow
def test_the_gpu_bench_without_a_gpu_says_so_in_one_line(tmp_path):
    completed = run_gpu_bench(tmp_path)

    assert completed.returncode == 2
    assert completed.stderr == ("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); "
                                "nothing measured\n")
    assert not (tmp_path / "gpu.jsonl").exists()


@pytest.mark.slow
def test_the_gpu_bench_quick_mode_runs_its_rounds_on_the_cpu(tmp_path):
    completed = run_gpu_bench(tmp_path, "--quick")

    assert completed.returncode == 0, completed.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "gpu.jsonl").read_text().splitlines()]
    assert [record["workers"] for record in records] == [1, 2]
    assert all(record["device"] == "cpu" and record["rounds"] == 2 and record["gpu_utilisation_percent"] is None
               for record in records)
    assert all(is_positive(record[key]) for record in records for key in ("round_seconds", "samples_per_second"))


def bf16_study():
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import bf16_accuracy
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    return bf16_accuracy


def finals(setting_a: tuple[list[float], list[float]], setting_b: tuple[list[float], list[float]]) -> dict:
    """{(dataset, algorithm, precision, seed): final accuracy} from (fp32 by seed, bf16 by seed) per setting."""
    values = {}
    for (dataset, algorithm), (fp32, bf16) in {("fmnist", "fedavg"): setting_a, ("cifar10", "fedcme"): setting_b}.items():
        for seed, (f, b) in enumerate(zip(fp32, bf16)):
            values[(dataset, algorithm, "fp32", seed)], values[(dataset, algorithm, "bf16", seed)] = f, b
    return values


def test_the_bf16_rule_needs_a_small_mean_difference_and_each_setting_within_its_seed_spread():
    verdict = bf16_study().verdict
    # A: d = mean(+0.5, 0) = +0.25 points, fp32 std 1.41; B: d = +0.5, fp32 std 0 (the seeds agree)
    result = verdict(finals(([0.80, 0.82], [0.805, 0.82]), ([0.60, 0.60], [0.60, 0.61])))
    rows = {row["dataset"]: row for row in result["settings"]}
    assert rows["fmnist"]["difference_points"] == pytest.approx(0.25)
    assert rows["fmnist"]["fp32_seed_std_points"] == pytest.approx(2 ** 0.5)
    assert rows["fmnist"]["within_seed_spread"] and not rows["cifar10"]["within_seed_spread"]
    assert result["mean_abs_difference_points"] == pytest.approx(0.375)
    assert result["bf16_may_be_default"] is False
    # B's seeds now spread by 2 points (std 1.41): both settings within, mean |d| 0.375 <= 0.5
    assert verdict(finals(([0.80, 0.82], [0.805, 0.82]), ([0.60, 0.62], [0.61, 0.62])))["bf16_may_be_default"]
    # every d within its spread, but bf16 is 1 point better on average: over the 0.5-point bound all the same
    result = verdict(finals(([0.80, 0.82], [0.81, 0.83]), ([0.60, 0.62], [0.61, 0.63])))
    assert all(row["within_seed_spread"] for row in result["settings"])
    assert result["mean_abs_difference_points"] == pytest.approx(1.0) and not result["bf16_may_be_default"]


def run_bf16_bench(tmp_path, *options: str) -> subprocess.CompletedProcess:
    return run_bench_without_gpu("bf16_accuracy.py", tmp_path / "bf16.jsonl", *options)


@pytest.mark.slow
def test_the_bf16_study_quick_mode_trains_every_run_in_both_precisions_gives_the_verdict_and_resumes(tmp_path):
    completed = run_bf16_bench(tmp_path, "--quick")

    assert completed.returncode == 0, completed.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "bf16.jsonl").read_text().splitlines()]
    runs = [record for record in records if record["bench"] == "bf16_accuracy_run"]
    assert sorted((r["dataset"], r["algorithm"], r["precision"], r["seed"]) for r in runs) == sorted(
        (d, a, p, s) for d in ("fmnist", "cifar10") for a in ("fedavg", "fedcme(0.01)") for p in ("fp32", "bf16")
        for s in (0, 1))
    assert all(len(r["accuracy"]) == 2 and r["final_accuracy"] == pytest.approx(sum(r["accuracy"]) / 2) for r in runs)
    [summary] = [record for record in records if record["bench"] == "bf16_accuracy"]
    assert len(summary["settings"]) == 4 and isinstance(summary["bf16_may_be_default"], bool)
    assert "| fmnist | fedcme(0.01) |" in completed.stderr and "be a default." in completed.stderr

    # --resume keeps the 16 finished runs of this device and length: none trains again, the verdict is the same
    resumed = run_bf16_bench(tmp_path, "--quick", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "bf16.jsonl").read_text().splitlines()]
    assert sum(record["bench"] == "bf16_accuracy_run" for record in records) == 16
    first, second = [record for record in records if record["bench"] == "bf16_accuracy"]
    assert second["settings"] == first["settings"]


def test_the_bf16_study_names_an_unknown_dataset_in_one_line(tmp_path):
    completed = run_bf16_bench(tmp_path, "--datasets", "fmnist,mnist")

    assert completed.returncode == 2
    assert completed.stderr == "bench/bf16_accuracy.py: --datasets mnist: not one of fmnist,cifar10\n"
    assert not (tmp_path / "bf16.jsonl").exists()


def test_resume_keeps_only_the_runs_of_this_device_length_and_mode_and_names_a_damaged_line(tmp_path):
    finished_runs = bf16_study().finished_runs
    results = tmp_path / "results.jsonl"
    run = {"bench": "bf16_accuracy_run", "dataset": "fmnist", "algorithm": "fedavg", "precision": "fp32", "seed": 0}
    lines = [{**run, "device": "cpu", "rounds": 2, "quick": True},
             {**run, "device": "cpu", "rounds": 2, "quick": False, "seed": 1},
             {**run, "device": "cpu", "rounds": 30, "quick": False, "seed": 2},
             {**run, "device": "NVIDIA H200", "rounds": 2, "quick": False, "seed": 3},
             {"bench": "bf16_accuracy", "device": "cpu", "rounds": 2, "quick": False}]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))

    assert list(finished_runs(results, device="cpu", rounds=2, quick=True)) == [("fmnist", "fedavg", "fp32", 0)]
    assert list(finished_runs(results, device="cpu", rounds=2, quick=False)) == [("fmnist", "fedavg", "fp32", 1)]
    assert finished_runs(tmp_path / "absent.jsonl", device="cpu", rounds=2, quick=False) == {}

    results.write_text(results.read_text() + '{"bench": "bf16_accuracy_run", "dev\n')
    with pytest.raises(ValueError, match=r"results\.jsonl:6: not a JSON record .*without --resume"):
        finished_runs(results, device="cpu", rounds=2, quick=False)
