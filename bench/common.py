"""Shared helpers of the benchmark scripts under bench/.

Every script prints one JSON line per measurement and appends it to a results file
(`bench/results.jsonl` unless `--results PATH`). A record holds the bench name, the machine
(architecture, cores this process may use, torch version and threads), the parameters,
the raw figures (medians of repeats) and the ratios, which are measured side by side in one
run with the variants interleaved (absolute times drift on shared machines, ratios less).

Scripts run as `python bench/NAME.py`, so this module is imported as `common`.
"""

from __future__ import annotations

import argparse
import json
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flows.common.command import QUIET_ENVIRONMENT as CLI_QUIET_ENVIRONMENT
from flows.orchestration.prefect_server import SERVER_ENVIRONMENT, free_port, server_command, stop_with_parent, wait_until_healthy

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results.jsonl"

# The command line's quiet, telemetry-free defaults (a user's own settings win), with more time for
# a temporary Prefect server: benchmarks start many, fresh databases included, on busy machines.
QUIET_ENVIRONMENT = {**CLI_QUIET_ENVIRONMENT, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}

# Decompressed Fashion-MNIST / CIFAR-10 files (from the read-only mirror), outside the repo and
# shared by the scripts so that only the first run decompresses and verifies them.
DATA_CACHE = Path(tempfile.gettempdir()) / "fedcme-bench-data"


def quiet_environment() -> None:
    """Call before importing prefect, mlflow or distributed."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    import torch

    return {
        "machine": platform.machine(),
        "cores": cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options every script has: --quick, --results, --repeats."""
    parser = argparse.ArgumentParser(description=(description or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smallest sizes, 1 repeat: checks the script works")
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"JSON-lines file to append to ({RESULTS})")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per variant (median reported)")
    return parser


def emit(bench: str, record: Mapping[str, Any], results: Path | str = RESULTS, **extra: Any) -> dict[str, Any]:
    """Print one JSON line and append it to `results`."""
    line_record = {"bench": bench, **machine(), **extra, **record}
    line_record["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    line = json.dumps(line_record, default=_plain)
    print(line, flush=True)
    results = Path(results)
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    return line_record


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def median(values) -> float:
    return float(statistics.median(values))


def rounded(values: Mapping[str, float], digits: int = 4) -> dict[str, float]:
    return {key: round(float(value), digits) for key, value in values.items()}


def ratio(numerator: float, denominator: float, digits: int = 3) -> float | None:
    return round(numerator / denominator, digits) if denominator else None


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def interleaved(variants: Mapping[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each variant, `repeats` times, variants interleaved so that machine noise
    hits them alike (after `warmup` untimed runs of each)."""
    for _ in range(warmup):
        for action in variants.values():
            action()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, action in variants.items():
            seconds[name].append(timed(action))
    return seconds


# ------------------------------------------------------------------------------ data
def data_mirror() -> Path | None:
    """The offline dataset mirror: $FEDCME_DATA_MIRROR, else ../shared/data beside the repo."""
    configured = os.environ.get("FEDCME_DATA_MIRROR")
    for candidate in (configured, REPO_ROOT.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "fashion-mnist").is_dir():
            return Path(candidate)
    return None


def data_section(dataset: str, *, train_subset: int | None = None, test_subset: int | None = None,
                 synthetic: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `data` config section: real data from the mirror (decompressed under DATA_CACHE), or
    the synthetic dataset of the same shape when no mirror exists (the record says which)."""
    if dataset != "synthetic" and data_mirror() is None:
        print(f"bench: no data mirror, using synthetic data instead of {dataset}", file=sys.stderr)
        shape, size = ([3, 32, 32], 50000) if dataset == "cifar10" else ([1, 28, 28], 60000)
        return {"dataset": "synthetic", "synthetic": {"num_train": train_subset or size,
                                                       "num_test": test_subset or 10000, "shape": shape}}
    if dataset == "synthetic":
        return {"dataset": "synthetic", "synthetic": dict(synthetic or {})}
    section: dict[str, Any] = {"dataset": dataset, "mirror": str(data_mirror()), "data_dir": str(DATA_CACHE)}
    if train_subset is not None:
        section["train_subset"] = train_subset
    if test_subset is not None:
        section["test_subset"] = test_subset
    return section


def experiment_values(
    *,
    data: Mapping[str, Any],
    clients: int,
    per_round: int,
    epochs: int,
    rounds: int = 1,
    algorithm: Mapping[str, Any] | None = None,
    model: str = "fmnist_cnn",
    alpha: float = 0.1,
    min_size: int = 10,
    runner: Mapping[str, Any] | None = None,
    batch_size: int = 64,
) -> dict[str, Any]:
    """A complete experiment config as plain values (for config_from_dict or a YAML file)."""
    return {
        "seed": 0,
        "device": "cpu",
        "data": dict(data),
        "partition": {"method": "dirichlet", "alpha": alpha, "min_size": min_size},
        "federation": {"num_clients": clients, "clients_per_round": per_round, "rounds": rounds},
        "training": {"local_epochs": epochs, "batch_size": batch_size},
        "model": {"name": model},
        "algorithm": dict(algorithm or {"name": "fedcme", "mu": 0.01}),
        "runner": dict(runner or {"kind": "threads", "workers": 2, "threads_per_worker": 1}),
    }


def describe(config) -> dict[str, Any]:
    """The parameters of an experiment config that a benchmark record names."""
    data = config.data
    return {
        "dataset": data.dataset,
        "train_samples": data.train_subset or (data.synthetic.num_train if data.dataset == "synthetic" else None),
        "model": config.model.name,
        "algorithm": config.algorithm.name,
        "K": config.federation.num_clients,
        "M": config.federation.clients_per_round,
        "E": config.training.local_epochs,
        "batch_size": config.training.batch_size,
        "alpha": config.partition.alpha,
    }


# ----------------------------------------------------------------------- processes
def tree_rss_bytes(pid: int, proportional: bool = False) -> int:
    """Resident memory of a process and all its descendants (bytes): the sum of their RSS, or
    with `proportional` of their PSS (shared pages such as torch's libraries split between the
    processes sharing them; needs psutil, slower)."""
    try:
        import psutil
    except ImportError:
        return 0 if proportional else _proc_tree_rss(pid)
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_full_info().pss if proportional else process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            pass
    return total


def _proc_tree_rss(pid: int) -> int:
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pending += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
    return total


# --------------------------------------------------------------- shared Prefect server
SHARED_PREFECT_API_URL = "FEDCME_BENCH_PREFECT_API_URL"  # set by `run_all.py --quick` for round, overhead and startup


def shared_prefect_api_url(quick: bool) -> str | None:
    """The quick suite's shared Prefect server (its API URL), if run_all gave one; full mode never
    uses one (each measurement starts its own temporary server)."""
    return (os.environ.get(SHARED_PREFECT_API_URL) or None) if quick else None


class PrefectServer:
    """A temporary Prefect server for the whole quick suite (one start instead of one per
    script): the command Prefect's own temporary server runs (``prefect.server.api.server.
    SubprocessASGIServer``: uvicorn on 127.0.0.1, UI off, ephemeral services), with a scratch
    PREFECT_HOME (so a fresh database) and without block-type registration (no bench uses
    blocks). Starts at once; `wait_ready` blocks until it answers."""

    def __init__(self) -> None:
        import subprocess

        self.home = Path(tempfile.mkdtemp(prefix="fedcme-bench-prefect-"))
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        environment = {**os.environ, **{key: value for key, value in QUIET_ENVIRONMENT.items() if key not in os.environ},
                       "PREFECT_HOME": str(self.home), **SERVER_ENVIRONMENT, "PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}
        environment.pop("PREFECT_API_URL", None)
        environment.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
        self.process = subprocess.Popen(
            server_command(self.port), env=environment, cwd=self.home, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=functools.partial(stop_with_parent, os.getpid()),  # noqa: PLW1509 - run_all starts it before any thread
        )
        self._ready = False

    def wait_ready(self, timeout: float | None = None) -> str:
        """Block until the server answers /health (or raise); returns its API URL."""
        if not self._ready:
            timeout = timeout or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 180)
            wait_until_healthy(self.process, self.api_url, timeout, "the shared Prefect server")
            self._ready = True
        return self.api_url

    def stop(self) -> None:
        import shutil
        import signal
        import subprocess

        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)
