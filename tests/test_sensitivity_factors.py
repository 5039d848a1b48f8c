"""The sensitivity study's factor metadata in the grid files (flows.report.factors, report sections): the study
is the report's; the library (fedcme_core.config) keeps its keys as plain data and trains no differently."""

from __future__ import annotations

import shutil

import pytest

from fedcme_core.config.files import ConfigError
from fedcme_core.config.params import load_params, params_from_dict
from flows.report.factors import ReportFactor, ReportReferences, load_study

from .conftest import REPO_ROOT
from .sensitivity_helpers import SENSITIVITY, sensitivity_values, write_grid


def test_the_shipped_sensitivity_file_names_every_factor_and_trains_its_runs():
    params = load_params(SENSITIVITY)
    c2 = load_params(REPO_ROOT / "configs" / "params-sensitivity-c2.yaml")
    report = load_study(SENSITIVITY, params)

    assert [factor.name for factor in report.factors] == [
        "sample-mean", "sample-sum", "sample-sum-mu01", "class-mean-sum", "class-mean-sumd", "classifier2",
        "optimizer-swap", "class-counts", "e4", "noaug", "c2"]
    assert report.references.model_dump() == {"fedavg": "fedavg", "fedrs": "fedrs-a05", "fedcme": "fedcme-mu001",
                                              "twin": "fedcme-no-exchange", "fedprox": "fedprox-mu001"}
    setups = [factor for factor in report.factors if factor.is_setup(report.references, report.name)]
    assert [factor.name for factor in setups] == ["e4", "noaug", "c2"]
    assert all(factor.fedrs and factor.fedprox for factor in setups)  # like-for-like baselines
    trained = {"sensitivity": set(params.grid.methods) | set(params.ablation.methods), "sensitivity-c2":
               set(c2.grid.methods)}
    for factor in report.factors:
        assert set(factor.methods(report.references).values()) <= trained[report.factor_grid(factor)], factor.name


def test_the_report_keys_change_no_cell_config():
    values = sensitivity_values()
    bare = {**values, "report": {key: values["report"][key] for key in ("name", "target_accuracy", "published")}}
    with_factors, without = params_from_dict(values), params_from_dict(bare)

    cells = list(with_factors.all_cells())
    assert cells == list(without.all_cells()) and len(cells) == 72  # 21 methods x 3 seeds, 9 on seed 0
    assert all(with_factors.cell_config(*cell) == without.cell_config(*cell) for cell in cells)


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["factors"][1].update(twin="sample-sum-nxx"),
     r"report\.factors\.1\.twin: sample-sum-nxx \(sample-sum\) not defined in methods$"),
    (lambda r: r["references"].update(fedrs="fedrs-a5"),
     r"report\.references\.fedrs: fedrs-a5 not defined in methods$"),
    (lambda r: r.pop("references"), r"yaml: report\.factors: needs report\.references"),
    (lambda r: r["factors"][2].update(name="sample-mean"),
     r"yaml: report\.factors: names must differ, sample-mean given twice$"),
    (lambda r: r["factors"][2].update(name="reference"), r"yaml: report\.factors: 'reference' names today's readings"),
    (lambda r: r["factors"][0].update(setting="b3"), r"report\.factors\.0\.setting: .*b3"),
    (lambda r: r["factors"][0].update(setting="a0.5"), r"report\.factors\.0\.setting: a0\.5 \(sample-mean\) is not a "
                                                       r"partition of the sensitivity grid \(its partitions: a0\.1\)$"),
    (lambda r: r["factors"][0].update(colour="red"), r"report\.factors\.0\.colour"),
    (lambda r: r["factors"][0].pop("twin"), r"report\.factors\.0\.twin: missing$"),
])
def test_bad_factor_metadata_is_one_line_naming_the_key(tmp_path, change, message):
    values = sensitivity_values()
    change(values["report"])
    path = write_grid(tmp_path, values)

    with pytest.raises(ConfigError, match=message) as raised:
        load_study(path)
    assert "\n" not in str(raised.value) and str(raised.value).startswith(str(path))
    load_params(path)  # the library reads the grid file all the same: no training reads the study


def test_a_factor_of_another_grid_is_checked_against_that_grid_file_when_it_exists(tmp_path):
    values = sensitivity_values()
    values["report"]["factors"][-1]["twin"] = "fedcme-no-exchange-x"
    path = write_grid(tmp_path, values)

    assert load_study(path).factors[-1].twin == "fedcme-no-exchange-x"  # no sensitivity-c2 file here
    shutil.copy(REPO_ROOT / "configs" / "params-sensitivity-c2.yaml", tmp_path / "params-sensitivity-c2.yaml")
    with pytest.raises(ConfigError, match=r"report\.factors\.10\.twin: fedcme-no-exchange-x \(c2\) not defined in "
                                          r"methods of the sensitivity-c2 grid \(.*params-sensitivity-c2\.yaml\)$"):
        load_study(path)


def test_a_factors_runs_by_role_fill_fedavg_from_the_references_and_only_a_setup_has_its_own():
    references = ReportReferences(fedavg="avg", fedrs="rs", fedcme="cme", twin="cme-nx")
    reading = ReportFactor(name="r", label="a reading", fedcme="r", twin="r-nx")
    setup = ReportFactor(name="s", label="a setup", fedcme="s", twin="s-nx", fedavg="avg-s", fedrs="rs-s")

    assert ReportFactor.roles() == ("fedcme", "twin", "fedavg", "fedrs", "fedprox")
    assert reading.methods(references) == {"fedcme": "r", "twin": "r-nx", "fedavg": "avg"}
    assert setup.methods(references) == {"fedcme": "s", "twin": "s-nx", "fedavg": "avg-s", "fedrs": "rs-s"}
    assert not reading.is_setup(references, "main") and setup.is_setup(references, "main")
    assert reading.model_copy(update={"grid": "other"}).is_setup(references, "main")
    assert not reading.model_copy(update={"fedavg": "avg"}).is_setup(references, "main")  # today's FedAvg, named
