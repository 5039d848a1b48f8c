"""Layout and precision of training (fedcme_core.client.compute): candidates, calibration, the machine
cache, bf16 autocast in the one local loop, and a run that records and keeps its choice."""

from __future__ import annotations

import json
import time

import pytest
import torch

from fedcme_core.client import compute as compute_module
from fedcme_core.client.compute import Compute, ComputeChoice, candidates, native_bf16, resolve
from fedcme_core.config.schema import TrainingConfig
from fedcme_core.rounds import RunPaths, final_model, run_experiment
from fedcme_core.client.training import ClientHooks

from .helpers import fresh_run, same_state, tiny_client_data

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test its own machine cache."""
    monkeypatch.setenv("FEDCME_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize(("channels_last", "precision", "native", "expected"), [
    (False, "fp32", False, ["nchw+fp32"]),
    (True, "bf16", False, ["channels_last+bf16"]),  # asked for explicitly: used even where it is emulated
    ("auto", "fp32", False, ["nchw+fp32", "channels_last+fp32"]),
    ("auto", "auto", False, ["nchw+fp32", "channels_last+fp32"]),  # no native bf16: not a candidate
    ("auto", "auto", True, ["nchw+fp32", "nchw+bf16", "channels_last+fp32", "channels_last+bf16"]),
    (False, "auto", True, ["nchw+fp32", "nchw+bf16"]),
])
def test_candidates_follow_the_settings_and_the_device(monkeypatch, channels_last, precision, native, expected):
    monkeypatch.setattr(compute_module, "native_bf16", lambda device: native)

    assert [option.name for option in candidates(channels_last, precision, CPU)] == expected


def sleeping_step(seconds_per_option: dict[str, float], calls: list[str]):
    def step(option: Compute) -> int:
        calls.append(option.name)
        time.sleep(seconds_per_option[option.name])
        return 64

    return step


def test_calibration_keeps_the_fastest_and_the_machine_cache_repeats_it(cache_dir):
    calls: list[str] = []
    step = sleeping_step({"nchw+fp32": 0.004, "channels_last+fp32": 0.001}, calls)

    first = resolve("auto", "fp32", CPU, "model|shape", step)
    second = resolve("auto", "fp32", CPU, "model|shape", step)

    assert first.compute == Compute(channels_last=True) and first.chosen_by == "calibration"
    assert first.samples_per_second["channels_last+fp32"] > 2 * first.samples_per_second["nchw+fp32"]
    assert 0 < first.calibration_seconds < 1
    assert second.compute == first.compute and second.chosen_by == "machine cache"
    calibration_calls = 1 + 1 + compute_module.CALIBRATION_REPEATS * compute_module.CALIBRATION_STEPS * 2
    assert len(calls) == calibration_calls  # the second resolve trained nothing
    assert len(json.loads((cache_dir / "compute.json").read_text())) == 1


def test_a_calibration_that_finishes_second_adopts_the_first_cached_choice(cache_dir):
    """Two fresh runs of one config that calibrate at once (say, on two test or grid processes)
    must still choose alike: the other process caches nchw while this one finds channels_last."""
    key = "model|shape"
    other = ComputeChoice(Compute(channels_last=False), "calibration", {"nchw+fp32": 1.0}, 0.1, "cpu")
    faster_channels_last = sleeping_step({"nchw+fp32": 0.004, "channels_last+fp32": 0.001}, [])

    def step(option: Compute) -> int:
        if not (cache_dir / "compute.json").exists():  # the other process finishes first
            entry = compute_module.cache_key(CPU, key, candidates("auto", "fp32", CPU))
            compute_module._keep_first(compute_module.cache_path(), entry, other)
        return faster_channels_last(option)

    adopted = resolve("auto", "fp32", CPU, key, step)
    again = resolve("auto", "fp32", CPU, key, faster_channels_last)

    assert adopted.compute == again.compute == Compute(channels_last=False)
    assert adopted.chosen_by == again.chosen_by == "machine cache"
    cached = json.loads((cache_dir / "compute.json").read_text())
    assert [entry["name"] for entry in cached.values()] == ["nchw+fp32"]


def test_a_fixed_setting_is_not_calibrated_and_a_damaged_cache_is_calibrated_again(cache_dir):
    calls: list[str] = []
    step = sleeping_step({"nchw+fp32": 0.001, "channels_last+fp32": 0.003}, calls)

    fixed = resolve(True, "fp32", CPU, "model|shape", step)
    cache_dir.mkdir()
    (cache_dir / "compute.json").write_text("{not json")
    calibrated = resolve("auto", "fp32", CPU, "model|shape", step)

    assert fixed.compute == Compute(channels_last=True) and fixed.chosen_by == "config"
    assert calibrated.compute == Compute(channels_last=False) and calibrated.chosen_by == "calibration"
    assert calls  # only the calibration trained
    assert ComputeChoice.from_json(json.loads(json.dumps(calibrated.to_json()))).compute == calibrated.compute


def test_layout_keeps_values_and_sets_strides():
    images = torch.randn(5, 3, 4, 4)
    nhwc = Compute(channels_last=True).layout(images)

    assert torch.equal(nhwc, images) and nhwc.is_contiguous(memory_format=torch.channels_last)
    assert Compute(channels_last=True).in_layout(nhwc) and not Compute().in_layout(nhwc)
    assert Compute().layout(nhwc).is_contiguous()
    assert Compute(channels_last=True).layout(torch.arange(5)).shape == (5,)  # labels untouched


def test_bf16_autocast_trains_close_to_fp32_with_fp32_weights():
    from fedcme_core.client.training import train_epochs

    inputs, labels = tiny_client_data(96)
    runs = {}
    for precision in ("fp32", "bf16"):
        run = fresh_run(seed=0)
        train_epochs(run, inputs, labels, ClientHooks(), 2, 16, Compute(precision=precision))
        runs[precision] = run

    fp32, bf16 = runs["fp32"], runs["bf16"]
    assert all(parameter.dtype == torch.float32 for parameter in bf16.model.parameters())
    assert all(state["momentum_buffer"].dtype == torch.float32 for state in bf16.optimizer.state.values())
    assert not same_state(fp32.model, bf16.model)  # autocast really ran in bf16
    difference = max((a - b).abs().max().item() for a, b in zip(fp32.model.parameters(), bf16.model.parameters()))
    assert difference < 0.05
    assert abs(fp32.epoch_losses[-1] - bf16.epoch_losses[-1]) < 0.1


@pytest.mark.slow  # 5 runs and a real calibration
def test_a_run_records_its_choice_and_a_resumed_run_keeps_it(tmp_path, synthetic_config, cache_dir, monkeypatch):
    config = synthetic_config({"federation.rounds": 2})  # channels_last and precision: auto (the defaults)
    straight = tmp_path / "straight"
    run_experiment(config, straight)
    recorded = json.loads(RunPaths(straight).compute.read_text())
    assert recorded["chosen_by"] == "calibration"
    assert recorded["precision"] in (("fp32", "bf16") if native_bf16(CPU) else ("fp32",))

    # The same config on the same machine chooses alike (machine cache) and gives the same bits.
    again = tmp_path / "again"
    run_experiment(config, again)
    assert json.loads(RunPaths(again).compute.read_text())["name"] == recorded["name"]
    assert same_state(final_model(config, straight), final_model(config, again))

    # A run interrupted after round 1 keeps its recorded choice, whatever a new calibration would say.
    resumed = tmp_path / "resumed"
    run_experiment(synthetic_config({"federation.rounds": 1}), resumed)
    before_resume = RunPaths(resumed).compute.read_text()
    cache_dir.joinpath("compute.json").unlink()
    flipped = Compute(channels_last=not recorded["channels_last"])
    monkeypatch.setattr(compute_module, "time_candidates",
                        lambda step, options: {option.name: 2.0 if option == flipped else 1.0 for option in options})
    run_experiment(config, resumed)
    assert RunPaths(resumed).compute.read_text() == before_resume
    assert json.loads(before_resume)["name"] == recorded["name"]
    assert same_state(final_model(config, straight), final_model(config, resumed))
    # while a new run would now take the other layout
    other = tmp_path / "other"
    run_experiment(config, other)
    assert json.loads(RunPaths(other).compute.read_text())["name"] == flipped.name


def test_a_missing_or_damaged_compute_record_is_named(tmp_path, synthetic_config):
    from fedcme_core.rounds import RunError, run_compute

    with pytest.raises(RunError, match="compute.json: missing"):
        run_compute(tmp_path / "nothing")
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config({"federation.rounds": 1}), run_dir)
    RunPaths(run_dir).compute.write_text('{"channels_last": true}')
    with pytest.raises(RunError, match="compute.json: not a valid compute record"):
        run_compute(run_dir)


def test_training_config_accepts_auto_and_booleans_only():
    from fedcme_core.config.schema import ConfigError, config_from_dict

    assert TrainingConfig().channels_last == "auto" and TrainingConfig().precision == "auto"
    with pytest.raises(ConfigError, match="training.channels_last: Input should be a valid boolean"):
        config_from_dict({"training": {"channels_last": "maybe"}})
    with pytest.raises(ConfigError, match="training.precision: Input should be 'fp32', 'bf16', 'tf32' or 'auto'"):
        config_from_dict({"training": {"precision": "fp16"}})
