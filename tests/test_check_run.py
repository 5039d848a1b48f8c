"""tools/check_run.py's comparison of a fresh `make run` with the README's table of the default grid."""

from __future__ import annotations

import sys

from fedcme_core.config.params import load_params

from .conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
from check_run import README_TABLE, TOLERANCE_POINTS, readme_problems, readme_table  # noqa: E402

TABLE = f"""intro

{README_TABLE} α=1.0) | final accuracy | Δ |
|---|---:|---:|
| FedAvg | 72.06 ± 0.32 | |
| FedProx(0.01) | 72.04 ± 0.34 | -0.01 ± 0.02 |
| FedRS(0.5) | **72.35 ± 0.41** | +0.29 ± 0.08 |
| FedCME(0.01) | 71.81 ± 1.33 | -0.24 ± 1.65 |

after
"""


def summaries(**percent: float) -> dict[str, dict]:
    return {f"reports/summary/{method}.json": {"final_accuracy": value / 100} for method, value in percent.items()}


def test_the_readme_table_is_read_label_by_label_bold_included():
    assert readme_table(TABLE) == {"FedAvg": 72.06, "FedProx(0.01)": 72.04, "FedRS(0.5)": 72.35,
                                   "FedCME(0.01)": 71.81}
    assert readme_table("no table here\n") == {}


def test_the_shipped_readme_has_a_row_for_every_method_of_the_default_grid():
    params = load_params(REPO_ROOT / "params.yaml")
    table = readme_table((REPO_ROOT / "README.md").read_text(encoding="utf-8"))

    assert {params.label(method) for method in params.grid.methods} == set(table)
    assert params.base.training.precision == "fp32"  # the table was made in fp32; the grid pins it


def test_a_method_beyond_half_a_point_of_the_readme_is_one_line_naming_both_figures():
    params = load_params(REPO_ROOT / "params.yaml")
    close = summaries(**{"fedavg": 72.06 + TOLERANCE_POINTS - 0.01, "fedprox-mu001": 72.00, "fedrs-a05": 72.33,
                         "fedcme-mu001": 71.59})

    assert readme_problems(params, close, TABLE) == []
    far = {**close, **summaries(**{"fedcme-mu001": 71.25})}
    assert readme_problems(params, far, TABLE) == [
        "reports/summary/fedcme-mu001.json: FedCME(0.01) 71.25% is more than 0.5 points from the README's 71.81%"]
    assert readme_problems(params, close, "no table") == [
        f"README.md: no table starting {README_TABLE!r} to compare with"]
