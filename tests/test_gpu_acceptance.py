"""bench/gpu_acceptance.py: on a CPU it refuses in one line (exit 2); --dry-run runs its CPU-checkable
phases (every algorithm twice on 1 and 4 workers, bit-identical; a SIGKILLed run resumed equal to a
straight one) and writes one well-formed record; BENCHMARKS.md names its command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT

SCRIPT = ["bench/gpu_acceptance.py"]


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path):
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a GPU machine too sees none
    done = subprocess.run([sys.executable, *SCRIPT, "--results", str(tmp_path / "r.jsonl")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env=no_gpu)

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "no CUDA device" in done.stderr
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow  # 30 one-round runs and a killed child: about 20 s
def test_the_dry_run_checks_the_cpu_parts_and_writes_one_record(tmp_path):
    results = tmp_path / "r.jsonl"
    done = subprocess.run([sys.executable, *SCRIPT, "--dry-run", "--results", str(results)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert record["bench"] == "gpu_acceptance" and record["dry_run"] is True and record["passed"] is True
    assert set(record["determinism"]) == {"fedavg", "fedprox", "moon", "fedrs", "scaffold", "fedcme"}
    assert all(phase["bit_identical"] and phase["max_abs_vs_cpu"] == 0.0 for phase in record["determinism"].values())
    assert record["resume"]["killed"] and record["resume"]["rounds_at_kill"] >= 1 and record["resume"]["bit_identical"]


def test_benchmarks_md_names_the_acceptance_command():
    assert "bench/gpu_acceptance.py" in (REPO_ROOT / "BENCHMARKS.md").read_text()
