"""Golden runs: every algorithm's final model after a 2-round synthetic run, pinned.

The hashes in ``golden_runs.json`` were recorded with the round code as it was before the
server side moved into the algorithms (commit 0e5e1ed): the refactored code must give the
same models bit for bit. A model is hashed as the SHA-256 of its state dict's tensors in key
order. Bits are promised per machine (the same config on the same machine), and a CPU with
another instruction set takes other kernel paths; so the exact hash is checked on the CPU
capability it was recorded on, and elsewhere the model's per-tensor sums and sums of squares
must agree with the recorded ones to 1e-4 (relative).

    python -m tests.test_golden_runs     # prints the figures of this checkout, to record
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from fedcme_core.config.schema import config_from_dict
from fedcme_core.config.files import apply_overrides
from fedcme_core.rounds import final_model, run_experiment

from .conftest import SYNTHETIC

GOLDEN = Path(__file__).with_name("golden_runs.json")

ALGORITHMS = {
    "fedavg": {"name": "fedavg"},
    "fedprox": {"name": "fedprox", "mu": 0.01},
    "moon": {"name": "moon", "mu": 1.0, "tau": 0.5},
    "fedrs": {"name": "fedrs", "alpha": 0.5},
    "fedcme": {"name": "fedcme", "mu": 0.1},
    "fedcme-no-exchange": {"name": "fedcme", "mu": 0.1, "exchange": "none"},
    "fedcme-no-alignment": {"name": "fedcme", "mu": 0.0},
    "fedcme-many-to-one": {"name": "fedcme", "mu": 0.1, "matching": "many_to_one"},
    "fedcme-exchange-model": {"name": "fedcme", "mu": 0.1, "exchange": "model"},
    "fedcme-exchange-extractor": {"name": "fedcme", "mu": 0.1, "exchange": "extractor"},
    "fedavg-crop-flip": {"name": "fedavg"},
}
OVERRIDES = {
    "fedavg-crop-flip": {"data.augment": "crop_flip"},
    "moon": {"model.projection_dim": 16},
    # An odd number selected: pairwise matching leaves one client out, many-to-one does not.
    "fedcme-many-to-one": {"federation.clients_per_round": 5},
}


def golden_config(label: str):
    values = dict(SYNTHETIC, algorithm=ALGORITHMS[label])
    pinned = {"training.channels_last": False, "training.precision": "fp32"}  # the golden bits are NCHW fp32
    return config_from_dict(apply_overrides(values, {**pinned, **OVERRIDES.get(label, {})}))


def model_figures(state: dict[str, torch.Tensor]) -> dict:
    digest = hashlib.sha256()
    sums = {}
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(key.encode())
        digest.update(tensor.numpy().tobytes())
        values = tensor.double()
        sums[key] = [float(values.sum()), float((values * values).sum())]
    return {"sha256": digest.hexdigest(), "sums": sums}


def golden_run(label: str, root: Path) -> dict:
    config = golden_config(label)
    run_experiment(config, root / label)
    return model_figures(final_model(config, root / label).state_dict())


def cpu_capability() -> str:
    return f"{torch.backends.cpu.get_cpu_capability()} torch {torch.__version__.split('+')[0]}"


@pytest.mark.parametrize("label", sorted(ALGORITHMS))
def test_the_final_model_matches_the_recorded_golden_run(tmp_path, label):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    recorded = golden["runs"][label]
    figures = golden_run(label, tmp_path)
    if cpu_capability() == golden["cpu_capability"]:
        assert figures["sha256"] == recorded["sha256"], f"{label}: the final model differs from the golden run"
    assert figures["sums"].keys() == recorded["sums"].keys()
    for key, (total, squares) in recorded["sums"].items():
        assert figures["sums"][key] == pytest.approx([total, squares], rel=1e-4, abs=1e-6), f"{label}: {key}"


if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory:
        runs = {label: golden_run(label, Path(directory)) for label in sorted(ALGORITHMS)}
    json.dump({"cpu_capability": cpu_capability(), "runs": runs}, sys.stdout, indent=1, sort_keys=True)
    print()
