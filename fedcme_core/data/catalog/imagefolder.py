"""``imagefolder``: a researcher's own images at ``data.path``, in torchvision's ImageFolder layout:
``train/<class>/<image>`` and ``test/<class>/<image>``, read with PIL.

The classes are the sub-folders of ``train/`` in sorted order (class i is the i-th name); each must hold
a training image, and each sub-folder of ``test/`` must name one of them. Files are read in sorted
order; those without an image extension (torchvision's ``IMG_EXTENSIONS``) or whose name starts with a
dot are skipped. Every image must have the size of the first training image, whose mode also decides
the channels: grey (1 channel) for PIL's single-band modes, RGB (3) for any other; every image is
converted to that mode. Pixels stay uint8 (0..255).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from fedcme_core.common.lazy import lazy_module
from fedcme_core.data.catalog.base import InputShape, Source, SourceSettings
from fedcme_core.data.sources import DataError

Image = lazy_module("PIL.Image")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F")
SPLITS = ("train", "test")


class ImageFolder(Source):
    name = "imagefolder"
    label = "imagefolder"
    needs_path = True

    def arrays(self, settings: SourceSettings) -> dict[str, np.ndarray]:
        root = self.data_path(settings)
        files = image_files(root)
        classes = sorted(files["train"])
        mode, size = image_format(files["train"][classes[0]][0])
        arrays: dict[str, np.ndarray] = {}
        for split in SPLITS:
            labelled = [(path, classes.index(name)) for name in sorted(files[split]) for path in files[split][name]]
            arrays[f"x_{split}"] = read_images([path for path, _ in labelled], mode, size)
            arrays[f"y_{split}"] = np.array([label for _, label in labelled], dtype=np.int64)
        return arrays

    def shape(self, settings: SourceSettings) -> InputShape | None:
        try:
            first_class = min(class_folders(Path(settings.path) / "train"))
            first = images_in(first_class)[0]
            status = first.stat()
        except (TypeError, ValueError, IndexError, OSError):  # no data.path, no class, no image: unknown
            return None
        return _image_shape(str(first), status.st_size, status.st_mtime_ns)

    def peek_classes(self, settings: SourceSettings) -> int | None:
        try:
            return len(class_folders(Path(settings.path) / "train")) or None
        except (TypeError, OSError):  # no data.path, no train/ folder: unknown
            return None

    def origin(self, settings: SourceSettings) -> dict[str, Any]:
        """data.path and the sha256 over every image read, in order: its path under data.path, then its bytes' sha256."""
        root = self.data_path(settings)
        digest = hashlib.sha256()
        for split, per_class in image_files(root).items():
            for name in sorted(per_class):
                for path in per_class[name]:
                    digest.update(f"{path.relative_to(root).as_posix()}\0".encode("utf-8"))
                    digest.update(hashlib.sha256(path.read_bytes()).digest())
        return {"path": str(root), "sha256": digest.hexdigest()}


def image_files(root: Path) -> dict[str, dict[str, list[Path]]]:
    """{split: {class: its image files, sorted}} of both splits, checked: the folders exist, every
    training class holds an image, every test class is a training class and the test split an image."""
    if not root.is_dir():
        raise DataError(f"data.path {root}: no such folder (an imagefolder dataset holds train/<class>/ and test/<class>/)")
    files = {}
    for split in SPLITS:
        if not (root / split).is_dir():
            raise DataError(f"{root}: lacks the folder {split}/ (an imagefolder dataset holds train/<class>/ and test/<class>/)")
        files[split] = class_images(root / split)
    if not files["train"]:
        raise DataError(f"{root / 'train'}: holds no class folder")
    empty = [name for name, paths in sorted(files["train"].items()) if not paths]
    if empty:
        raise DataError(f"{root / 'train'}: class{'es' if len(empty) > 1 else ''} {', '.join(empty)} "
                        f"{'have' if len(empty) > 1 else 'has'} no training sample (no image file)")
    unseen = sorted(set(files["test"]) - set(files["train"]))
    if unseen:
        raise DataError(f"{root / 'test'}: class{'es' if len(unseen) > 1 else ''} {', '.join(unseen)} "
                        "unseen in training (no such folder under train/)")
    if not any(files["test"].values()):
        raise DataError(f"{root / 'test'}: holds no image")
    return files


def class_images(folder: Path) -> dict[str, list[Path]]:
    """{class folder name: its image files, sorted by name} of `folder`'s sub-folders."""
    return {entry.name: images_in(entry) for entry in class_folders(folder)}


def class_folders(folder: Path) -> list[Path]:
    """`folder`'s sub-folders (one per class), sorted by name, hidden ones left out."""
    return sorted(entry for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))


def images_in(folder: Path) -> list[Path]:
    """The image files of `folder`, sorted by name: an image extension, not hidden."""
    return sorted(path for path in folder.iterdir()
                  if path.is_file() and not path.name.startswith(".") and path.suffix.lower() in IMAGE_EXTENSIONS)


def image_format(path: Path) -> tuple[str, tuple[int, int]]:
    """The mode every image is converted to ("L" or "RGB") and the (width, height) every image must have."""
    with opened(path) as image:
        return ("L" if image.mode in GREY_MODES else "RGB"), image.size


def read_images(paths: list[Path], mode: str, size: tuple[int, int]) -> np.ndarray:
    """uint8 [N, H, W] ("L") or [N, H, W, 3] ("RGB"); an image of another size is one DataError line."""
    width, height = size
    images = np.empty((len(paths), height, width, *(() if mode == "L" else (3,))), dtype=np.uint8)
    for index, path in enumerate(paths):
        with opened(path) as image:
            if image.size != size:
                raise DataError(f"{path}: {image.size[0]}x{image.size[1]} pixels, but the first training image is "
                                f"{width}x{height}; every image must have one size")
            images[index] = np.asarray(image.convert(mode), dtype=np.uint8)
    return images


def opened(path: Path):
    """PIL's image of `path`, loaded (a context manager); a file PIL cannot read is one DataError line."""
    try:
        image = Image.open(path)
        image.load()
    except (OSError, ValueError, SyntaxError) as error:  # PIL's UnidentifiedImageError is an OSError
        raise DataError(f"{path}: cannot read as an image ({type(error).__name__}: {error})") from None
    return image


@functools.lru_cache(maxsize=8)
def _image_shape(path: str, size: int, modified_ns: int) -> InputShape | None:
    """(C, H, W) that the first training image gives the dataset (None where it cannot be read)."""
    try:
        mode, (width, height) = image_format(Path(path))
    except DataError:
        return None
    return (1 if mode == "L" else 3), height, width
