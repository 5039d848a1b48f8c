"""Concurrency soak: several `fedcme train` at once on one machine, N times in a row, each time
with one runner killed by SIGKILL and run again (the long form of tests/test_concurrency.py).

Each repeat: a fresh PREFECT_HOME, MLflow sqlite store and runs folder; 4 experiments and a
duplicate pair (`same` twice) launched at the same moment; after a random delay one runner
still running is SIGKILLed and its command is run again at once. Counted: failures (a command
that exited other than 0 or the one-line refusal of a held run directory, a traceback, an
experiment not finished), lost and duplicated MLflow steps (steps 1..T exactly once per
experiment, over all its MLflow runs), processes left behind, and final models equal bit for bit
to those of uninterrupted runs (`fedcme simulate` on one thread, as the runners train).

Then the held-lock phase (:func:`held_lock_phase`, alone with ``--held-lock-only``): one `fedcme
train` while another process holds its MLflow sqlite store's write lock for ``--held-lock-seconds``
(200) from its 30th round on. Measured side by side in that one run: the wall time between round
lines before, during and after the hold, the console lines the hold cost, and whether the printed
`fedcme sync` command, run as printed once the store is free, leaves every step logged once.

    .venv/bin/python bench/concurrency_soak.py [--repeats 20] [--quick] [--seed 0] [--held-lock-only]
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from flows.common.processes import stop_left_behind

ROUNDS = 2
EXPERIMENTS = {"e0": 0, "e1": 1, "e2": 2, "e3": 3, "same": 9}  # experiment -> seed
LAUNCHES = ["e0", "e1", "e2", "e3", "same", "same"]
CONFIG = {
    "seed": 0, "device": "cpu",
    "data": {"dataset": "synthetic", "synthetic": {"num_train": 240, "num_test": 100, "shape": [1, 28, 28], "noise": 1.0}},
    "partition": {"method": "dirichlet", "alpha": 0.5, "min_size": 10},
    "federation": {"num_clients": 4, "clients_per_round": 2, "rounds": ROUNDS},
    "training": {"local_epochs": 2, "batch_size": 32},
    "model": {"name": "fmnist_cnn"}, "algorithm": {"name": "fedcme", "mu": 0.1},
    "runner": {"workers": 1, "threads_per_worker": 1},
}
KILL_WINDOW = (2.0, 45.0)  # seconds after the launch: imports, server start, set-up, rounds, model logging
REFUSAL = "is in use by PID"


def launch(folder: Path, experiment: str, environment: dict[str, str], tag: str) -> subprocess.Popen:
    """`fedcme train` of `experiment` in `folder`, its output in files (tag names them)."""
    command = [sys.executable, "-m", "flows.cli", "train", "--config", str(folder / "soak.yaml"), "--experiment",
               experiment, "--runs-dir", str(folder / "runs"), "--tracking-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--set", f"seed={EXPERIMENTS[experiment]}"]
    with (folder / f"{tag}.out").open("w") as out, (folder / f"{tag}.err").open("w") as err:
        return subprocess.Popen(command, cwd=folder, env=environment, stdout=out, stderr=err)


def judged(folder: Path, tag: str, experiment: str, status: int) -> str | None:
    """None for a good end (0, or the one-line refusal of the held `same`); else why not."""
    errors = (folder / f"{tag}.err").read_text(errors="replace")
    if "Traceback" in errors:
        return f"{tag} ({experiment}): traceback: {errors.strip().splitlines()[-1][:200]}"
    lines = errors.strip().splitlines()
    if status == 0 or (status == 2 and experiment == "same" and len(lines) == 1 and REFUSAL in lines[0]):
        return None
    return f"{tag} ({experiment}): exit {status}: {lines[-1][:200] if lines else ''}"


def same_model(first: dict, second: dict) -> bool:
    import torch

    return first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


def reference_models(scratch: Path) -> dict[str, dict]:
    """Each experiment's final model from one uninterrupted `fedcme simulate` (one torch thread)."""
    from fedcme_core.rounds import load_server_state

    folder = scratch / "reference"
    folder.mkdir()
    (folder / "soak.yaml").write_text(yaml.safe_dump(CONFIG))
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    models = {}
    for experiment, seed in EXPERIMENTS.items():
        subprocess.run([sys.executable, "-m", "flows.cli", "simulate", "--config", str(folder / "soak.yaml"),
                        "--experiment", experiment, "--runs-dir", str(folder / "runs"), "--set", f"seed={seed}"],
                       cwd=folder, env=environment, check=True, capture_output=True)
        models[experiment] = load_server_state(folder / "runs" / experiment, ROUNDS)["model"]
    return models


def mlflow_steps(uri: str) -> tuple[dict[str, list[int]], int]:
    """Per experiment, the eval/test_accuracy steps of all its MLflow runs; and the runs without any step."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name("fedcme-smoke")  # synthetic data (flows.tracking.names.mlflow_experiment_for)
    steps: dict[str, list[int]] = {name: [] for name in EXPERIMENTS}
    empty = 0
    for run in client.search_runs([found.experiment_id]) if found is not None else []:
        logged = [metric.step for metric in client.get_metric_history(run.info.run_id, "eval/test_accuracy")]
        steps.setdefault(run.data.tags.get("experiment", run.info.run_name), []).extend(logged)
        empty += not logged
    return steps, empty


def one_repeat(index: int, scratch: Path, rng: random.Random, references: dict[str, dict]) -> dict:
    from fedcme_core.rounds import completed_rounds, load_server_state

    folder = scratch / f"repeat-{index:02d}"
    folder.mkdir()
    (folder / "soak.yaml").write_text(yaml.safe_dump(CONFIG))
    token = f"FEDCME_CONCURRENCY_SOAK={os.getpid()}-{index}"
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment.update(PREFECT_HOME=str(folder / "prefect-home"), **dict([token.split("=", 1)]))
    started = time.monotonic()
    runners = {f"launch{number}": (experiment, launch(folder, experiment, environment, f"launch{number}"))
               for number, experiment in enumerate(LAUNCHES)}
    delay = rng.uniform(*KILL_WINDOW)
    while time.monotonic() - started < delay and any(process.poll() is None for _, process in runners.values()):
        time.sleep(0.05)
    running = sorted(tag for tag, (_, process) in runners.items() if process.poll() is None)
    killed = rng.choice(running) if running else None
    if killed is not None:
        runners[killed][1].send_signal(signal.SIGKILL)
        runners[killed][1].wait()
        runners["rerun"] = (runners[killed][0], launch(folder, runners[killed][0], environment, "rerun"))
    failures = []
    for tag, (experiment, process) in runners.items():
        try:
            status = process.wait(timeout=900)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
        if tag != killed and (reason := judged(folder, tag, experiment, status)) is not None:
            failures.append(f"repeat {index}: {reason}")
    leaked = stop_left_behind(token, timeout=30)
    steps, empty_runs = mlflow_steps(f"sqlite:///{folder / 'mlflow.db'}")
    expected = list(range(1, ROUNDS + 1))
    lost = sum(len(set(expected) - set(steps.get(name, []))) for name in EXPERIMENTS)
    duplicated = sum(len(logged) - len(set(logged)) for logged in steps.values())
    equal = 0
    for experiment in EXPERIMENTS:
        run_dir = folder / "runs" / experiment
        if not run_dir.is_dir() or completed_rounds(run_dir) != ROUNDS:
            failures.append(f"repeat {index}: {experiment} did not finish its {ROUNDS} rounds")
            continue
        equal += same_model(load_server_state(run_dir, ROUNDS)["model"], references[experiment])
    refused = sum(1 for tag in runners if tag != killed and REFUSAL in (folder / f"{tag}.err").read_text(errors="replace"))
    return {"failures": failures, "lost": lost, "duplicated": duplicated, "leaked": len(leaked), "equal": equal,
            "refused": refused, "empty_runs": empty_runs, "killed_after": round(delay, 1) if killed else None,
            "killed": runners[killed][0] if killed else None, "seconds": time.monotonic() - started}


HELD_AFTER_ROUNDS = 30  # rounds before the hold begins, and rounds measured after it ends


def intervals(times: list[tuple[float, int]], start: float, end: float) -> list[float]:
    """The wall seconds between consecutive round lines that both arrived within [start, end)."""
    inside = [at for at, _ in times if start <= at < end]
    return [later - earlier for earlier, later in zip(inside, inside[1:])]


def pace(gaps: list[float]) -> dict:
    return {"rounds": len(gaps), "median_seconds": round(statistics.median(gaps), 3) if gaps else None,
            "max_seconds": round(max(gaps), 3) if gaps else None}


def held_lock_phase(scratch: Path, hold: float) -> dict:
    """One `fedcme train` whose MLflow store is write-locked by this process for `hold` seconds from its
    30th round; the run is stopped (Ctrl-C) 30 rounds after the release, and its printed sync run."""
    folder = scratch / "held-lock"
    folder.mkdir()
    (folder / "soak.yaml").write_text(yaml.safe_dump({**CONFIG, "federation": {**CONFIG["federation"], "rounds": 100_000}}))
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment.update(PREFECT_HOME=str(folder / "prefect-home"), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    database = folder / "mlflow.db"
    command = [sys.executable, "-m", "flows.cli", "train", "--config", str(folder / "soak.yaml"), "--experiment", "lk",
               "--runs-dir", str(folder / "runs"), "--tracking-uri", f"sqlite:///{database}"]
    with (folder / "train.err").open("w") as err:
        process = subprocess.Popen(command, cwd=folder, env=environment, stdout=subprocess.PIPE, stderr=err, text=True)
    times: list[tuple[float, int]] = []
    window: dict[str, float] = {}
    stderr_lines: list[str] | None = None  # the console's lines before the Ctrl-C

    def hold_lock() -> None:
        connection = sqlite3.connect(database, isolation_level=None, timeout=120)
        connection.execute("begin exclusive")
        window["held"] = time.monotonic()
        time.sleep(hold)
        connection.execute("commit")
        connection.close()
        window["released"] = time.monotonic()

    holder = threading.Thread(target=hold_lock, daemon=True)
    console: list[list] = []  # [seconds after the hold began, the line], seen at the next round line
    for line in process.stdout:
        if line.startswith("round "):
            times.append((time.monotonic(), int(line.split()[1].split("/")[0])))
            written = (folder / "train.err").read_text(errors="replace").strip().splitlines()
            console += [[round(time.monotonic() - window.get("held", time.monotonic()), 1), text[:120]]
                        for text in written[len(console):]]
            if len(times) == HELD_AFTER_ROUNDS:
                holder.start()
            if "released" in window and sum(at > window["released"] for at, _ in times) > HELD_AFTER_ROUNDS:
                stderr_lines = (folder / "train.err").read_text(errors="replace").strip().splitlines()
                process.send_signal(signal.SIGINT)  # enough rounds after the hold: Ctrl-C (it resumes later)
                break
    process.wait(timeout=300)
    holder.join()
    if stderr_lines is None:  # the run ended on its own, before the phase stopped it
        stderr_lines = (folder / "train.err").read_text(errors="replace").strip().splitlines()
    if "released" not in window:
        raise RuntimeError(f"the run ended before the hold was over: {stderr_lines[-3:]}")
    hints = [line.rsplit("`", 2)[1] for line in stderr_lines if "fedcme sync" in line and line.endswith("`")]
    synced = subprocess.run(hints[0], shell=True, cwd=scratch, env=environment, capture_output=True, text=True,
                            timeout=600) if hints else None
    steps = mlflow_steps(f"sqlite:///{database}")[0].get("lk", [])
    committed = max(number for _, number in times)
    return {
        "hold_seconds": hold, "held_after_round": HELD_AFTER_ROUNDS,
        "before": pace(intervals(times, 0.0, window["held"])),
        "during": pace(intervals(times, window["held"], window["released"])),
        "after": pace(intervals(times, window["released"], float("inf"))),
        "console_lines_during_run": stderr_lines, "console_lines_seconds_after_hold": console, "tracebacks": sum("Traceback" in line for line in stderr_lines),
        "sync_hint": hints[0] if hints else None,
        "sync_exit": None if synced is None else synced.returncode,
        "sync_stderr_lines": None if synced is None else len(synced.stderr.strip().splitlines()),
        "steps_logged_once": sorted(steps) == list(range(1, len(steps) + 1)) and len(steps) >= committed,
        "rounds_committed": committed, "steps_logged": len(steps),
    }


def main() -> None:
    parser = common.parser(__doc__)  # its --repeats: the repeats of the pattern (default 20)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments and victims")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (its path is printed)")
    parser.add_argument("--held-lock-seconds", type=float, default=None,
                        help="how long the held-lock phase holds the store's write lock (200; 20 with --quick)")
    parser.add_argument("--held-lock-only", action="store_true", help="run the held-lock phase only")
    arguments = parser.parse_args()
    repeats = 1 if arguments.quick else arguments.repeats or 20
    common.quiet_environment()
    rng = random.Random(arguments.seed)
    scratch = Path(tempfile.mkdtemp(prefix="fedcme-bench-concurrency-"))
    hold = arguments.held_lock_seconds or (20.0 if arguments.quick else 200.0)
    if arguments.held_lock_only:
        common.emit("concurrency_held_lock", {**held_lock_phase(scratch, hold), "cpu": common_cpu()},
                    arguments.results, quick=arguments.quick)
        if not arguments.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    started = time.perf_counter()
    references = reference_models(scratch)
    results = []
    for index in range(repeats):
        result = one_repeat(index, scratch, rng, references)
        results.append(result)
        print(f"# repeat {index + 1}/{repeats}: {len(result['failures'])} failures, lost {result['lost']}, "
              f"duplicated {result['duplicated']}, leaked {result['leaked']}, models equal {result['equal']}/"
              f"{len(EXPERIMENTS)}, killed {result['killed']} after {result['killed_after']} s, "
              f"{result['seconds']:.0f} s", file=sys.stderr, flush=True)
        for failure in result["failures"]:
            print(f"#   {failure}", file=sys.stderr, flush=True)
    failures = [failure for result in results for failure in result["failures"]]
    common.emit("concurrency_soak", {
        "repeats": repeats, "launches_per_repeat": len(LAUNCHES) + 1, "experiments_per_repeat": len(EXPERIMENTS),
        "rounds": ROUNDS, "kill_window_seconds": list(KILL_WINDOW), "seed": arguments.seed,
        "failures": len(failures), "failure_examples": failures[:10],
        "lost_steps": sum(result["lost"] for result in results),
        "duplicated_steps": sum(result["duplicated"] for result in results),
        "leaked_processes": sum(result["leaked"] for result in results),
        "models_equal": sum(result["equal"] for result in results), "models_compared": repeats * len(EXPERIMENTS),
        "refused_launches": sum(result["refused"] for result in results),
        "mlflow_runs_without_steps": sum(result["empty_runs"] for result in results),
        "killed": [[result["killed"], result["killed_after"]] for result in results],
        "repeat_seconds_median": round(statistics.median(result["seconds"] for result in results), 1),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "cpu": common_cpu(),
    }, arguments.results, quick=arguments.quick)
    common.emit("concurrency_held_lock", {**held_lock_phase(scratch, hold), "cpu": common_cpu()}, arguments.results,
                quick=arguments.quick)
    if arguments.keep:
        print(f"# kept {scratch}", file=sys.stderr)
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def common_cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
