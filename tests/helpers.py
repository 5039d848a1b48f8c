"""Small shared builders for the tests (tiny tensors, seeded models, a copy of the repository)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from fedcme_core.config.schema import TrainingConfig
from fedcme_core.client.models import SplitModel, build_model
from fedcme_core.common.seeding import torch_generator
from fedcme_core.client.training import ClientHooks, LocalRun, save_local_run, start_local_run, train_epochs

TRAINING = TrainingConfig(local_epochs=4, batch_size=16)


def tiny_client_data(num_samples: int = 96, seed: int = 0, classes: tuple[int, ...] = (0, 1, 2, 3)):
    """Learnable 1x28x28 data: each class brightens its own image quadrant-ish band."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor(classes)[torch.randint(len(classes), (num_samples,), generator=generator)]
    inputs = torch.randn(num_samples, 1, 28, 28, generator=generator) * 0.5
    for row, label in enumerate(labels.tolist()):
        inputs[row, 0, 2 * label : 2 * label + 3, :] += 2.0
    return inputs, labels


def fresh_run(seed: int = 0, projection_dim: int | None = None) -> LocalRun:
    model = build_model("fmnist_cnn", projection_dim=projection_dim, seed=seed)
    return start_local_run(model, TRAINING, torch_generator(seed, "train", 0, 0))


def train(run: LocalRun, data, hooks: ClientHooks | None = None, epochs: int = 2) -> LocalRun:
    inputs, labels = data
    train_epochs(run, inputs, labels, hooks or ClientHooks(), epochs, TRAINING.batch_size)
    return run


def phase_one_checkpoints(folder: Path, clients: int = 2, epochs: int = 1) -> tuple[dict, dict]:
    """(client -> its swap checkpoint after `epochs` local epochs from its own seed, client -> where
    its exchanged checkpoint goes): the inputs of `exchange_checkpoints`."""
    data = tiny_client_data()
    swap = {client: folder / f"c{client}-swap.pt" for client in range(clients)}
    for client, path in swap.items():
        save_local_run(train(fresh_run(seed=client), data, epochs=epochs), path)
    return swap, {client: folder / f"c{client}-x.pt" for client in range(clients)}


def same_state(first: SplitModel, second: SplitModel) -> bool:
    a, b = first.state_dict(), second.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


class LinearSplitModel(nn.Module):
    """features(x) = x @ extractor.T, classify(h) = h @ classifier.T, with hand-set weights."""

    def __init__(self, extractor: torch.Tensor, classifier: torch.Tensor) -> None:
        super().__init__()
        self.extractor = nn.Linear(extractor.shape[1], extractor.shape[0], bias=False)
        self.classifier = nn.Linear(classifier.shape[1], classifier.shape[0], bias=False)
        with torch.no_grad():
            self.extractor.weight.copy_(extractor)
            self.classifier.weight.copy_(classifier)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.extractor(x)

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


def IdentityModel(dim: int) -> LinearSplitModel:
    """features(x) = x, classify(h) = h: the inputs are the logits."""
    return LinearSplitModel(torch.eye(dim), torch.eye(dim))


def copy_repository(source: Path, destination: Path, params_file: Path) -> None:
    """The repository's tracked and unignored files copied to `destination`, with `params_file` as params.yaml."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=source, capture_output=True,
                           text=True, check=True).stdout.split()
    # Not what an earlier `make run` of the checkout left (the pipeline's outputs and its lock).
    outputs = ("metrics/", "reports/", "models/", "runs/", "data/", "dvc.lock", "mlflow.db")
    for name in (name for name in files if not name.startswith(outputs)):
        if (source / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, destination / name)
    shutil.copy2(params_file, destination / "params.yaml")


def run_checked(command: list[str], cwd: Path, environment: dict[str, str], timeout: float = 900) -> str:
    """The stdout and stderr of `command`; a failure shows the last of both."""
    result = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def dvc_checkout(source: Path, workdir: Path, params_file: Path, mirror: Path,
                 environment: dict[str, str]) -> dict[str, str]:
    """`source` copied to `workdir` with `params_file` as params.yaml, git and DVC initialised there; the
    environment its commands run with: `environment` plus this interpreter's PATH and the data mirror."""
    copy_repository(source, workdir, params_file)
    environment = {**environment, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   "FEDCME_DATA_MIRROR": str(mirror), "DVC_NO_ANALYTICS": "1"}
    run_checked(["git", "init", "-q"], workdir, environment)
    run_checked(["dvc", "init", "-q", "-f"], workdir, environment)
    return environment


def assert_normalised_split(images: torch.Tensor, labels: torch.Tensor, count: int, shape: tuple) -> None:
    """A normalised split: float32 images [count, *shape] and int64 labels [count], both contiguous."""
    assert images.shape == (count, *shape)
    assert images.dtype == torch.float32 and images.is_contiguous()
    assert labels.shape == (count,)
    assert labels.dtype == torch.int64 and labels.is_contiguous()
