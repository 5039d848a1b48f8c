"""The manual pages CI runs (`tools/run_manual.py`, called by `.ci/run`): their steps are the fenced
bash blocks, in order; the own-study page has its six."""

from __future__ import annotations

import importlib.util

from .conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("run_manual", REPO_ROOT / "tools" / "run_manual.py")
run_manual = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_manual)


def test_the_steps_are_the_bash_blocks_in_order():
    page = "\n".join(["# A page", "```bash", "echo one", "```", "text", "```yaml", "grid: {}", "```",
                      "```bash", "echo two", "echo three", "```", "```", "plain", "```"])

    assert run_manual.steps(page) == ["echo one\n", "echo two\necho three\n"]


def test_ci_runs_the_own_study_page_whose_steps_cover_data_model_algorithm_tuning_and_grid():
    steps = run_manual.steps((REPO_ROOT / "docs" / "own-study.md").read_text())

    assert len(steps) == 6
    assert "own/shapes" in steps[0] and "fedcme_core/client/architectures/tiny_mlp.py" in steps[1]
    assert "fedcme_core/algorithms/fedls.py" in steps[2] and "fedcme check params.yaml" in steps[3]
    assert '"tune"' in steps[4] and "flows.pipeline.repro" in steps[5]
    assert "tools/run_manual.py docs/own-study.md" in (REPO_ROOT / ".ci" / "run").read_text()
