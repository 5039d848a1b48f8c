"""The grid progress lines of `python -m flows.repro` (`make run`): the format, the ETA and the watcher."""

from __future__ import annotations

import json
import os
import time

from flows.repro import GridProgress, duration, progress_line, stage_experiments

from .conftest import REPO_ROOT


def test_a_progress_line_gives_k_of_n_the_final_accuracy_elapsed_and_an_eta_from_the_run_times():
    line = progress_line(3, 8, "fmnist-a1.0-k10m10-fedrs-a05-s0", 0.71234, 252.0, [100.0, 80.0, 90.0])

    # ETA: the mean run (90 s) times the 5 experiments left.
    assert line == ("[grid] 3 of 8 done: fmnist-a1.0-k10m10-fedrs-a05-s0: final accuracy 71.23%, "
                    "elapsed 4m12s, ETA 7m30s")


def test_the_last_line_says_the_grid_is_done_and_a_missing_accuracy_is_a_dash():
    line = progress_line(2, 2, "x", None, 3725.0, [1800.0, 1925.0])

    assert line == "[grid] 2 of 2 done: x: final accuracy –, elapsed 1h02m, grid done"


def test_durations_read_in_seconds_minutes_and_hours():
    assert [duration(seconds) for seconds in (0, 45.4, 60, 754, 3600, 7322)] == ["0s", "45s", "1m00s", "12m34s",
                                                                                 "1h00m", "2h02m"]


def test_the_stage_names_of_the_default_grid_map_to_its_experiments():
    stages = stage_experiments(str(REPO_ROOT / "params.yaml"))

    assert len(stages) == 8
    assert stages["train@fedavg-fmnist-a1.0-clients0-0"] == "fmnist-a1.0-k10m10-fedavg-s0"
    assert stages["train@fedcme-mu001-fmnist-a1.0-clients0-1"] == "fmnist-a1.0-k10m10-fedcme-mu001-s1"


def test_the_watcher_reports_experiments_written_after_its_start_in_the_order_they_finish(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"final_accuracy": 0.5}))
    os.utime(old, (time.time() - 60, time.time() - 60))  # from an earlier run: not finished by this one
    lines: list[str] = []
    progress = GridProgress(["old", "b", "a"], metrics=tmp_path, write=lines.append)

    (tmp_path / "a.json").write_text(json.dumps({"final_accuracy": 0.25}))
    progress.poll()
    (tmp_path / "b.json").write_text(json.dumps({"final_accuracy": 0.5}))
    progress.poll()
    progress.poll()

    assert [line.split(",")[0] for line in lines] == ["[grid] 1 of 3 done: a: final accuracy 25.00%",
                                                      "[grid] 2 of 3 done: b: final accuracy 50.00%"]
    assert progress.pending == ["old"] and all("ETA " in line for line in lines)
