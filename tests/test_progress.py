"""The grid progress lines of `python -m flows.pipeline.repro` (`make run`): the format, the ETA and the watcher."""

from __future__ import annotations

import io
import json
import os
import time

from flows.pipeline.progress import GridDisplay, GridProgress, duration, progress_bar, progress_line
from flows.pipeline.repro import stage_experiments

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


class Terminal(io.StringIO):
    """A stream that says it is a terminal (or not)."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_in_a_terminal_the_progress_is_one_bar_cut_to_the_width_with_the_last_experiment():
    bar = progress_bar(3, 8, "fmnist-a1.0-k10m10-fedrs-a05-s0", 0.71234, 252.0, [100.0, 80.0, 90.0],
                       since_last=30.0, columns=200)

    # ETA: 5 left at 90 s each, less the 30 s since the last one finished; 3/8 of 20 cells filled.
    assert bar == ("[grid] ███████░░░░░░░░░░░░░ 3/8 · elapsed 4m12s · ETA 7m00s · "
                   "last: fmnist-a1.0-k10m10-fedrs-a05-s0 71.23%")
    assert progress_bar(0, 4, None, None, 5.0, []) == "[grid] ░░░░░░░░░░░░░░░░░░░░ 0/4 · elapsed 5s · ETA unknown"
    assert progress_bar(4, 4, "x", None, 65.0, [10.0]).endswith("4/4 · elapsed 1m05s · grid done · last: x –")
    narrow = progress_bar(3, 8, "fmnist-a1.0-k10m10-fedrs-a05-s0", 0.71234, 252.0, [90.0], columns=60)
    assert len(narrow) == 59 and narrow.endswith("…")  # never wraps: a wrapped line cannot be redrawn


def test_not_a_terminal_gets_the_plain_lines_and_a_terminal_one_bar_redrawn_under_the_stages_lines(tmp_path):
    outputs = {}
    for tty in (False, True):
        stream = Terminal(tty)
        display = GridDisplay(stream, columns=lambda: 200)
        progress = GridProgress(["a", "b"], metrics=tmp_path / str(tty), display=display)
        (tmp_path / str(tty)).mkdir()
        display.line("round    1/2 ...")  # a stage's own line
        (tmp_path / str(tty) / "a.json").write_text(json.dumps({"final_accuracy": 0.25}))
        progress.poll()
        display.line("round    2/2 ...")
        (tmp_path / str(tty) / "b.json").write_text(json.dumps({"final_accuracy": 0.5}))
        progress.stop()
        outputs[tty] = stream.getvalue()

    plain = outputs[False].splitlines()
    assert plain[0] == "round    1/2 ..." and plain[2] == "round    2/2 ..."
    assert plain[1].startswith("[grid] 1 of 2 done: a: final accuracy 25.00%, elapsed ")
    assert plain[3].startswith("[grid] 2 of 2 done: b: final accuracy 50.00%, elapsed ")
    assert plain[3].endswith("grid done")
    assert "\r" not in outputs[False] and "\x1b" not in outputs[False]

    # The terminal: each stage line erases the bar, is written whole, and the bar comes back below it;
    # the screen ends with the last bar on a line of its own.
    screen = outputs[True]
    assert screen.startswith("round    1/2 ...\n\r\x1b[2K[grid] ██████████░░░░░░░░░░ 1/2 · elapsed ")
    assert "last: a 25.00%\r\x1b[2Kround    2/2 ...\n[grid] ██████████" in screen
    assert screen.endswith("2/2 · elapsed 0s · grid done · last: b 50.00%\n")
    assert "[grid] 1 of 2" not in screen  # no plain lines in a terminal
    final_screen = [line.rsplit("\r\x1b[2K", 1)[-1] for line in screen.split("\n")]
    assert final_screen == ["round    1/2 ...", "round    2/2 ...",
                            "[grid] ████████████████████ 2/2 · elapsed 0s · grid done · last: b 50.00%", ""]
