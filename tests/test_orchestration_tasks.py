"""Prefect tasks made from the core's steps (flows/orchestration/tasks.py): any step function becomes a task
named by its step, its runs named by round, client and phase from the step's own parameters, and the
executor runs whatever function the round hands it, one task per call or one per worker."""

from __future__ import annotations

import inspect

import pytest

from fedcme_core.rounds import select_step, train_phase_step
from fedcme_core.server.faults import StepFailure
from flows.orchestration.tasks import (
    PrefectExecutor,
    Sealed,
    call_arguments,
    group_label,
    run_label,
    step_task,
    task_name,
    unsealed,
)


def test_a_task_run_is_named_by_step_round_client_and_phase():
    assert run_label("prepare", {"config": None, "run_dir": "r"}) == "prepare"
    assert run_label("select", {"round_index": 0}) == "select r1"
    assert run_label("local-train", {"round_index": 2, "client_id": 17, "phase_index": 0}) == "local-train r3 c17 p1"
    assert run_label("upload", {"round_index": 4, "client_id": 3}) == "upload r5 c3"  # a step without phases


def test_a_group_task_run_names_its_round_phase_and_clients():
    calls = [{"round_index": 0, "client_id": 3, "phase_index": 1}, {"round_index": 0, "client_id": 5, "phase_index": 1}]
    assert group_label("local-train-group", calls) == "local-train-group r1 p2 c3,5"
    assert group_label("local-train-group", []) == "local-train-group"


def test_a_step_is_named_by_its_parameters_and_its_task_by_its_step():
    arguments = call_arguments(train_phase_step, ("config", "runs/x", 2, 17, 1))
    assert arguments == {"config": "config", "run_dir": "runs/x", "round_index": 2, "client_id": 17, "phase_index": 1}
    assert (task_name("train_phase"), task_name("select"), task_name("a_new_step")) == (
        "local-train", "select", "a_new_step")


def test_any_core_step_becomes_a_task_with_the_steps_own_parameters_once_per_process():
    local_train = step_task("train_phase", train_phase_step, 2)

    assert local_train.name == "local-train" and step_task("train_phase", train_phase_step, 2) is local_train
    assert list(inspect.signature(local_train.fn).parameters) == list(inspect.signature(train_phase_step).parameters)
    assert step_task("select", select_step).name == "select"


def test_a_task_unseals_its_arguments_and_seals_what_the_step_returns_whatever_it_is():
    class Result:  # a step's result may be any object (a dataclass tomorrow)
        def __init__(self, value):
            self.value = value

    def scale(value, factor=1):
        return Result(value * factor)

    result = step_task("scale", scale).fn(Sealed(3), factor=Sealed(2))
    assert isinstance(result, Sealed) and isinstance(unsealed(result), Result) and unsealed(result).value == 6


@pytest.mark.slow
def test_the_executor_runs_the_function_it_is_given_for_any_step(prefect_server):
    from prefect import flow

    def double(value: int, round_index: int) -> int:
        return 2 * value

    def fail_on_three(value: int, round_index: int, client_id: int) -> int:
        if value == 3:
            raise ValueError("three")
        return value + round_index

    @flow(name="toy-steps")
    def toy(client_tasks: str) -> tuple:
        executor = PrefectExecutor(torch_threads=1, workers=2, client_tasks=client_tasks)
        called = executor.call("double", double, 5, 0)
        mapped = executor.map("offset", fail_on_three, [(1, 10, 0), (3, 10, 1), (2, 10, 2)], retries=0)
        return called, mapped, executor.task_runs

    for client_tasks, task_runs in (("client", 4), ("worker", 3)):
        called, mapped, runs = toy(client_tasks)
        assert called == 10 and runs == task_runs, client_tasks
        assert mapped[0] == 11 and mapped[2] == 12 and isinstance(mapped[1], StepFailure), client_tasks
        assert "three" in mapped[1].reason, client_tasks


def test_importing_the_flow_starts_no_process_and_only_entries_import_it():
    """The commit is read as a run starts (no `git` at import; libraries' own probes aside), and what imports the flow module imports
    its entry (run_training) or its flow (train_flow), never a helper that belongs elsewhere."""
    import ast
    import subprocess
    import sys

    from .conftest import REPO_ROOT

    script = ("import subprocess\nstarted = []\ninit = subprocess.Popen.__init__\n"
              "def recording(self, *args, **kwargs):\n    started.append(' '.join(map(str, args[0] if args else kwargs['args'])))\n"
              "    init(self, *args, **kwargs)\n"
              "subprocess.Popen.__init__ = recording\nimport flows.orchestration.train\nprint(started)\n"
              "from flows.tracking.views import git_commit\ngit_commit()\nprint(started)\n")  # as a run starts
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    at_import, at_start = result.stdout.strip().splitlines()[-2:]
    assert "git rev-parse" not in at_import and "git rev-parse HEAD" in at_start, (at_import, at_start)
    imported = {(str(path.relative_to(REPO_ROOT)), alias.name)
                for folder in ("flows", "bench", "tools") for path in (REPO_ROOT / folder).rglob("*.py")
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module == "flows.orchestration.train"
                for alias in node.names}
    assert imported and {name for _, name in imported} <= {"run_training", "train_flow"}, sorted(imported)
