"""The model architectures' names and input shapes, without importing torch.

:mod:`fedcme_core.client.models` builds the architectures. The config (:mod:`fedcme_core.config.schema`,
a layer above) checks a dataset against its model's input shape, and validating a config must not
cost torch's import: `fedcme train` validates the whole params file before it starts anything; so
this module imports nothing (``fedcme_core.client`` imports nothing on its own either).
"""

MODEL_NAMES = ("fmnist_cnn", "cifar_cnn")

# Input shape each architecture is built for: (channels, height, width).
MODEL_INPUT_SHAPES: dict[str, tuple[int, int, int]] = {
    "fmnist_cnn": (1, 28, 28),
    "cifar_cnn": (3, 32, 32),
}

# Batch of every no-grad pass of the architecture (test-set evaluation, SPEC step 7's local features and
# evaluation vectors): the largest batch that pays (bench/evaluation.py, BENCHMARKS.md "Evaluation").
# fmnist_cnn's first convolution output is B x 32 x 24 x 24 floats: in four runs of the round's own calls
# 256 was between 1.4x slower and 1.1x faster than 128, and 1024 is 0.6x of 128, so it stays at 128.
# cifar_cnn's activations have 6 channels: its test set evaluates 1.21x faster at 1024 than at 128.
MODEL_INFERENCE_BATCH: dict[str, int] = {
    "fmnist_cnn": 128,
    "cifar_cnn": 1024,
}
