"""What `data.augment: crop_flip` costs per sample, against the training step it precedes.

One torch thread, cifar_cnn, batch 64 of random CIFAR-shaped images: the batched crop_flip
(fedcme_core.data.augment) of a batch, and one training step of the one local loop on that batch
(SGD with momentum), interleaved `--repeats` times over `--steps` batches each, in both memory
layouts. Reported: microseconds per sample of each, and the augmentation's share of an
augmented step. Quick mode (checks the script works): 3 batches, 1 repeat.

    .venv/bin/python bench/augment.py [--steps 50] [--repeats 5] [--quick]
"""

from __future__ import annotations

import common
import torch

from fedcme_core.data.augment import crop_flip
from fedcme_core.client.compute import Compute
from fedcme_core.config.schema import TrainingConfig
from fedcme_core.client.models import build_model
from fedcme_core.client.training import ClientHooks, start_local_run, train_epochs

BATCH = 64


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--steps", type=int, default=50)
    arguments = parser.parse_args()
    steps = 3 if arguments.quick else arguments.steps
    repeats = 1 if arguments.quick else (arguments.repeats or 5)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, 32, 32, generator=generator)
    labels = torch.randint(10, (BATCH,), generator=generator)
    training = TrainingConfig(batch_size=BATCH)
    for compute in (Compute(channels_last=False), Compute(channels_last=True)):
        batch = compute.layout(images)
        run = start_local_run(compute.model(build_model("cifar_cnn", 10, None, seed=0)), training, generator)

        def augment() -> None:
            for _ in range(steps):
                crop_flip(batch, generator)

        def train() -> None:  # `steps` epochs of one batch: `steps` training steps
            train_epochs(run, batch, labels, ClientHooks(), steps, BATCH, compute)

        seconds = common.interleaved({"crop_flip": augment, "train_step": train}, repeats)
        per_sample = {name: common.median(values) / (steps * BATCH) * 1e6 for name, values in seconds.items()}
        common.emit("augment", {
            "quick": arguments.quick, "model": "cifar_cnn", "batch_size": BATCH, "steps": steps, "repeats": repeats,
            "compute": compute.name, "per_sample_us": common.rounded(per_sample, 3),
            "share_of_augmented_step": round(per_sample["crop_flip"] / (per_sample["crop_flip"] + per_sample["train_step"]), 4),
        }, arguments.results)


if __name__ == "__main__":
    main()
