"""Run every benchmark under bench/ (full mode by default, `--quick` for the smoke sizes).

Each script runs as its own process, prints its JSON lines and appends them to the results
file. By default one script at a time (they measure time: never overlap full runs); quick
mode may overlap scripts with `--jobs 2` (its figures only check that the scripts work). A
failing script is reported and the others still run; the exit status is 1 if any failed.

    .venv/bin/python bench/run_all.py [--quick] [--jobs 1] [--results PATH] [--only a,b] [--skip a,b]
    make bench          # full mode, one script at a time, appends to bench/results.jsonl
    make bench-quick    # quick mode, two scripts at a time (records carry "quick": true)

Quick mode starts ONE temporary Prefect server for the whole suite (in the background, while the
scripts without Prefect run) and gives it to round, overhead and startup
($FEDCME_BENCH_PREFECT_API_URL), instead of one temporary server per script and run; `--prefect-api-url URL` uses a running server instead
(the smoke test passes the test suite's server). Full mode: every measurement starts its own.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import common

# Cheap, CPU-only measurements first; the ones that start worker processes and Prefect last.
SCRIPTS = ("local_training", "evaluation", "per_sample", "parallel", "memory", "overhead", "startup", "round", "augment")
# With --jobs > 1 (quick): the longest first, except that the three that need the shared Prefect
# server wait for two others (it starts meanwhile), so the lanes end together.
QUICK_ORDER = ("parallel", "memory", "round", "per_sample", "local_training", "evaluation", "augment", "overhead", "startup")
USES_PREFECT = {"round", "overhead", "startup"}

_print_lock = threading.Lock()


def run_script(name: str, results: Path, quick: bool, timeout: float | None, capture: bool,
               prefect_api_url=None) -> tuple[str, float]:
    """Run bench/NAME.py; `prefect_api_url` (a callable giving the shared server's URL, blocking
    until it answers) for the scripts that use Prefect in quick mode."""
    command = [sys.executable, str(BENCH_DIR / f"{name}.py"), "--results", str(results)]
    if quick:
        command.append("--quick")
    environment = None
    started = time.perf_counter()
    if prefect_api_url is not None and name in USES_PREFECT:
        try:
            environment = {**os.environ, common.SHARED_PREFECT_API_URL: prefect_api_url()}
        except Exception as error:  # noqa: BLE001 - reported like a failing script
            with _print_lock:
                print(f"# bench {name}: no shared Prefect server: {error}", file=sys.stderr, flush=True)
            return "failed (no Prefect server)", time.perf_counter() - started
    with _print_lock:
        print(f"# bench {name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    output = None
    try:
        completed = subprocess.run(command, timeout=timeout, capture_output=capture, text=True, check=False,
                                   env=environment)
        outcome = "ok" if completed.returncode == 0 else f"failed (exit {completed.returncode})"
        output = completed
    except subprocess.TimeoutExpired as expired:
        outcome = f"timed out after {timeout:.0f} s"
        output = expired
    if capture and output is not None:  # overlapping scripts: print each one's output in one piece
        with _print_lock:
            sys.stdout.write(_text(output.stdout))
            sys.stdout.flush()
            sys.stderr.write(_text(output.stderr))
            sys.stderr.flush()
    return outcome, time.perf_counter() - started


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", type=Path, default=common.RESULTS)
    parser.add_argument("--only", default=None, help="comma-separated script names (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated script names to leave out")
    parser.add_argument("--jobs", type=int, default=1, help="scripts run at once (quick mode only; default 1)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed per script (default: none)")
    parser.add_argument("--prefect-api-url", default=None,
                        help="quick mode: a running Prefect server for round, overhead and startup (default: start one)")
    arguments = parser.parse_args()
    chosen = [name.strip() for name in arguments.only.split(",")] if arguments.only else list(SCRIPTS)
    skipped = {name.strip() for name in arguments.skip.split(",") if name.strip()}
    unknown = (set(chosen) | skipped) - set(SCRIPTS)
    if unknown:
        parser.error(f"unknown benchmarks {sorted(unknown)}; choose from {', '.join(SCRIPTS)}")
    if arguments.jobs > 1 and not arguments.quick:
        parser.error("--jobs > 1 overlaps measurements: only for --quick")
    names = [name for name in chosen if name not in skipped]
    if arguments.prefect_api_url and not arguments.quick:
        parser.error("--prefect-api-url is for --quick (full mode: every measurement starts its own server)")
    if arguments.quick:
        names.sort(key=QUICK_ORDER.index)
    common.quiet_environment()
    started = time.perf_counter()
    capture = arguments.jobs > 1
    server, prefect_api_url = None, None
    if arguments.quick and USES_PREFECT & set(names):
        if arguments.prefect_api_url:
            prefect_api_url = lambda: arguments.prefect_api_url
        else:
            server = common.PrefectServer()  # starts now, answers while the first scripts run
            ready = threading.Lock()

            def prefect_api_url() -> str:
                with ready:  # one waiter polls at a time
                    return server.wait_ready()

            print(f"# shared Prefect server for the quick suite: {server.api_url} (starting)", file=sys.stderr, flush=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, arguments.jobs)) as pool:
            futures = {
                name: pool.submit(run_script, name, arguments.results, arguments.quick, arguments.timeout, capture,
                                  prefect_api_url)
                for name in names
            }
            outcomes = {name: future.result() for name, future in futures.items()}
    finally:
        if server is not None:
            server.stop()
    for name in names:
        outcome, seconds = outcomes[name]
        print(f"# {name:<15} {outcome:<20} {seconds:7.1f} s", file=sys.stderr)
    print(f"# all done in {time.perf_counter() - started:.1f} s (jobs={arguments.jobs}); results in {arguments.results}",
          file=sys.stderr)
    return 0 if all(outcome == "ok" for outcome, _ in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
