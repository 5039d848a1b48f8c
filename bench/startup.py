"""Start-up: seconds from launching `fedcme train` to its first round, with a cold and a warm
PREFECT_HOME, and with a Prefect server already running.

Each launch runs `.venv/bin/fedcme train --config <tiny synthetic FedCME config> --experiment
NAME` as a subprocess in a scratch working directory (its own MLflow sqlite store there). The
cold launch gets a fresh, empty PREFECT_HOME (and MLflow store); the warm launch right after
reuses both. Times from the launch:

* first_output:   the first line on stdout;
* round_start:    the run directory's round-0 server state exists (the `prepare` task is done,
                  the first round's `select` comes next): "the first round starting";
* round_finished: the line `round    1/...` (full mode only; quick mode stops at round_start).

The launch is then stopped (its process group: the command and its temporary Prefect server); a
process of its PREFECT_HOME still running 30 s later is an error.
Pairs (cold, warm) are repeated `--repeats` times with fresh homes; medians. A third launch per
repeat, "server_running", finds a Prefect server already up (one started by this script before
the repeats, as `prefect server start` would be on a researcher's machine; PREFECT_API_URL points
at it) and a warm PREFECT_HOME: the command then starts no server of its own. Target: warm
round_start <= 5 s.

Quick mode (checks the script works) makes one launch only, until the first round starts, and
has no warm figures nor cold/warm ratio: a cold one (state "cold"), or, when `run_all.py --quick`
gives the suite's shared Prefect server ($FEDCME_BENCH_PREFECT_API_URL), one against that running
server (state "server_running": fresh PREFECT_HOME and MLflow store, but no temporary server
start, the costliest part of the quick suite).

    .venv/bin/python bench/startup.py [--repeats 3] [--until start|finish] [--quick]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common
import yaml

from flows.common.processes import stop_left_behind

ROUND_LINE = re.compile(r"^round\s+1/")


def fedcme_command() -> list[str]:
    script = Path(sys.executable).with_name("fedcme")
    return [str(script)] if script.exists() else [sys.executable, "-m", "flows.cli"]


def launch(config_file: Path, scratch: Path, prefect_home: Path, experiment: str, until: str, timeout: float,
           api_url: str | None = None) -> dict:
    """Run one `fedcme train` until the first round starts (or finishes); returns the event times.
    Without `api_url` (a running Prefect server) the command starts its own temporary server."""
    environment = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    environment.pop("PREFECT_API_URL", None)
    if api_url:
        environment["PREFECT_API_URL"] = api_url
    for key, value in common.QUIET_ENVIRONMENT.items():
        environment.setdefault(key, value)
    command = [
        *fedcme_command(), "train", "--config", str(config_file), "--experiment", experiment,
        "--runs-dir", str(scratch / "runs"), "--tracking-uri", f"sqlite:///{scratch / 'mlflow.db'}",
    ]
    round_zero = scratch / "runs" / experiment / "server" / "round-0000.pt"
    events: dict[str, float] = {}
    output: list[str] = []
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=scratch, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,  # its own process group: we stop it and its server together
    )

    def read() -> None:
        for line in process.stdout:
            now = time.perf_counter() - started
            output.append(line.rstrip())
            events.setdefault("first_output", now)
            if ROUND_LINE.match(line):
                events.setdefault("round_finished", now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while time.perf_counter() - started < timeout:
            if "round_start" not in events and round_zero.exists():
                events["round_start"] = time.perf_counter() - started
            done = "round_start" in events if until == "start" else "round_finished" in events
            if done or process.poll() is not None:
                break
            time.sleep(0.01)
    finally:
        stop(process)
        reader.join(timeout=5)
    left = stop_left_behind(f"PREFECT_HOME={prefect_home}", timeout=30)
    if left:
        raise RuntimeError(f"fedcme train ({experiment}) left processes {left} running after it stopped (killed now)")
    wanted = ("first_output", "round_start") + (("round_finished",) if until == "finish" else ())
    missing = [name for name in wanted if name not in events]
    if missing:
        tail = "\n".join(output[-15:])
        raise RuntimeError(f"fedcme train ({experiment}) gave no {', '.join(missing)} (exit {process.returncode}):\n{tail}")
    return {name: round(events[name], 3) for name in wanted}


def stop(process: subprocess.Popen) -> None:
    """Stop the launched command and its children (its own process group)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    try:  # children left behind (e.g. the temporary Prefect server) share the group
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def measure(states, repeats: int, values: dict, until: str, timeout: float, api_url: str | None,
            scratch_root: Path, timings: dict[str, list[dict]]) -> None:
    """`repeats` rounds of one launch per state; each repeat has a fresh PREFECT_HOME and MLflow store
    (cold, then warm reusing them); only "server_running" (and quick mode's shared server) gets `api_url`."""
    config_file = scratch_root / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(values), encoding="utf-8")
    for repeat in range(repeats):
        scratch = scratch_root / f"pair-{repeat}"
        scratch.mkdir()
        home = scratch / "prefect-home"
        for state in states:
            server = api_url if state == "server_running" else None
            timings[state].append(launch(config_file, scratch, home, f"{state}-{repeat}", until, timeout, server))


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--until", choices=["start", "finish"], default=None,
                        help="stop each launch when the first round starts (quick) or finishes (full)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per launch")
    arguments = parser.parse_args()
    until = arguments.until or ("start" if arguments.quick else "finish")
    repeats = arguments.repeats or (1 if arguments.quick else 3)
    shared_server = common.shared_prefect_api_url(arguments.quick)
    states = (("server_running" if shared_server else "cold"),) if arguments.quick else ("cold", "warm", "server_running")
    values = common.experiment_values(
        data=common.data_section("synthetic", synthetic={"num_train": 200, "num_test": 50}),
        clients=4, per_round=2, epochs=2, alpha=0.5, batch_size=32,
    )
    timings: dict[str, list[dict]] = {state: [] for state in states}
    running_server = None
    if "server_running" in states and not shared_server:
        running_server = common.PrefectServer()
        shared_server = running_server.wait_ready()
    try:
        with tempfile.TemporaryDirectory(prefix="fedcme-bench-startup-") as scratch_name:
            measure(states, repeats, values, until, arguments.timeout, shared_server, Path(scratch_name), timings)
    finally:
        if running_server is not None:
            running_server.stop()
    medians = {
        state: {event: round(common.median(run[event] for run in runs), 3) for event in runs[0]}
        for state, runs in timings.items()
    }
    record = {
        "command": "fedcme train --config tiny.yaml --experiment NAME (synthetic, K=4, M=2, E=2, 1 round)",
        "until": until,
        "torch_threads": 1,  # per client training in the launched run (threads runner, 2 workers x 1 thread)
        "repeats": repeats,
        "states": list(states),
        "prefect_server": (
            "shared by the quick suite" if arguments.quick and shared_server
            else "temporary (started by the command); server_running: started by this script before the launches"
            if running_server else "temporary (started by the command)"
        ),
        "seconds": medians,
        "runs": timings,
        "ratio_warm_vs_server_running_round_start": (
            common.ratio(medians["warm"]["round_start"], medians["server_running"]["round_start"])
            if {"warm", "server_running"} <= medians.keys() else None
        ),
        "ratio_cold_vs_warm_round_start": (
            common.ratio(medians["cold"]["round_start"], medians["warm"]["round_start"]) if "warm" in medians else None
        ),
        "target": "warm round_start <= 5 s",
    }
    common.emit("startup", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
