"""The model architectures' names and input shapes, without importing torch.

The config (:mod:`fedcme_core.config`) checks a dataset against its model's input shape, and
validating a config must not cost torch's import: `fedcme train` validates the whole params
file before it starts anything. :mod:`fedcme_core.models` builds the architectures.
"""

MODEL_NAMES = ("fmnist_cnn", "cifar_cnn")

# Input shape each architecture is built for: (channels, height, width).
MODEL_INPUT_SHAPES: dict[str, tuple[int, int, int]] = {
    "fmnist_cnn": (1, 28, 28),
    "cifar_cnn": (3, 32, 32),
}
