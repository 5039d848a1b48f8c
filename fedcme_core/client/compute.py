"""Memory layout and precision of local training, chosen per model and machine by measurement.

``training.channels_last: auto | true | false`` and ``training.precision: fp32 | bf16 | tf32 | auto``.
fp32 is IEEE fp32 on every device (TF32 off on CUDA); ``tf32`` (CUDA only, chosen explicitly, never
by ``auto``) lets cuBLAS and cuDNN compute fp32 products in TensorFloat-32. bf16 is autocast
(``torch.autocast``) around the forward pass and the loss, on the CPU and on
CUDA; weights, gradients, optimizer state, checkpoints and aggregation stay fp32. ``auto`` times
a few training steps of every allowed candidate on the run's own model and batch shape (fewer on
a heavy model: CALIBRATION_SECONDS; BENCHMARKS.md, "Larger models", gives the cost) and keeps the
fastest; bf16 is a candidate only where the device has native bf16 arithmetic (oneDNN's check on
the CPU: AVX512-BF16 or AMX; compute capability 8.0 or more on CUDA, emulation not counted).
The device's flags and identity (:mod:`fedcme_core.client.device_flags`) are recorded beside the
choice (``ComputeChoice.device``).

The choice is part of what defines a run's results, so it is resolved once, when the run
directory is made, and written there (``compute.json``): every step on every runner reads it,
and a resumed run keeps it. A calibration's choice is also kept per machine (CPU model, torch
version, device, model, batch shape; timed on one thread whatever the runner) in
``$FEDCME_CACHE_DIR/compute.json`` (default ``~/.cache/fedcme``), so that fresh runs of one
config on one machine choose alike and stay bit-identical (on a GPU: the same GPU model,
driver and flags, :mod:`fedcme_core.client.device_flags`); where two calibrate at once, the one
that caches its choice first wins and the other adopts it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from fedcme_core.common.atomic import atomic_write_bytes
from fedcme_core.common.locks import FileLock
from fedcme_core.client.device_flags import device_record

Precision = Literal["fp32", "bf16", "tf32"]
CALIBRATION_STEPS = 3  # timed training steps per candidate and repeat (after one warm-up step)
CALIBRATION_REPEATS = 2  # candidates interleaved, the fastest repeat kept
# A candidate's repeat stops early once its steps took this long (at least one step), so that a heavy
# model (resnet18_gn on a CPU) calibrates in one step per candidate and repeat on its run's own batch,
# rather than on a smaller batch whose fastest layout may differ.
CALIBRATION_SECONDS = 0.5


@dataclass(frozen=True)
class Compute:
    """How a run's tensors are laid out and computed."""

    channels_last: bool = False
    precision: Precision = "fp32"

    @property
    def name(self) -> str:
        return f"{'channels_last' if self.channels_last else 'nchw'}+{self.precision}"

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def in_layout(self, tensor: torch.Tensor) -> bool:
        return tensor.dim() != 4 or tensor.is_contiguous(memory_format=self.memory_format)

    def layout(self, tensor: torch.Tensor) -> torch.Tensor:
        """Images [N, C, H, W] in this layout (other tensors unchanged)."""
        return tensor if tensor.dim() != 4 else tensor.contiguous(memory_format=self.memory_format)

    def model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def autocast(self, device: torch.device) -> torch.autocast:
        """bf16 autocast of the forward pass and the loss (a no-op for fp32)."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")


@dataclass
class ComputeChoice:
    """The resolved choice and how it was made (what `compute.json` and MLflow record)."""

    compute: Compute
    chosen_by: Literal["config", "calibration", "machine cache"]
    samples_per_second: dict[str, float] = field(default_factory=dict)
    calibration_seconds: float | None = None
    machine: str = ""
    # The resolved device and its flags (device_flags.device_record): {"type": "cpu"}, or on CUDA
    # also the GPU's index, name, capability, driver, TF32 and determinism; {} in records made before.
    device: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.compute), "name": self.compute.name, "chosen_by": self.chosen_by,
                "samples_per_second": self.samples_per_second, "calibration_seconds": self.calibration_seconds,
                "machine": self.machine, "device": self.device}

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> ComputeChoice:
        return cls(Compute(bool(values["channels_last"]), values["precision"]), values["chosen_by"],
                   dict(values.get("samples_per_second") or {}), values.get("calibration_seconds"),
                   values.get("machine", ""), dict(values.get("device") or {}))

    def tags(self) -> dict[str, str]:
        """The MLflow tags of the choice: compute, compute_chosen_by, compute_samples_per_second, and
        the device's (device; on CUDA gpu_name, gpu_driver, tf32, deterministic)."""
        tags = {"compute": self.compute.name, "compute_chosen_by": self.chosen_by,
                "compute_samples_per_second": json.dumps(self.samples_per_second, sort_keys=True)}
        if self.device:
            tags["device"] = str(self.device.get("type"))
        if self.device.get("type") == "cuda":
            tags.update(gpu_name=str(self.device.get("name")), gpu_driver=str(self.device.get("driver")),
                        tf32=str(self.device.get("tf32")).lower(),
                        deterministic=str(self.device.get("deterministic")).lower())
        return tags


def native_bf16(device: torch.device) -> bool:
    """True when `device` computes bf16 natively (so that bf16 can pay): on CUDA, that GPU (not the
    current one) with compute capability 8.0 or more; emulation (a T4's) does not count."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def candidates(channels_last: bool | str, precision: str, device: torch.device) -> list[Compute]:
    """Every layout and precision the settings allow on `device`."""
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(f"training.precision: tf32 is TensorFloat-32 of CUDA GPUs; the {device.type} computes "
                         "fp32 (set precision: fp32)")
    layouts = [False, True] if channels_last == "auto" else [bool(channels_last)]
    if precision == "auto":
        precisions: list[Precision] = ["fp32", "bf16"] if native_bf16(device) else ["fp32"]
    else:
        precisions = [precision]  # type: ignore[list-item]
    return [Compute(layout, chosen) for layout in layouts for chosen in precisions]


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return model or platform.processor() or platform.machine()


def cache_key(device: torch.device, key: str, options: list[Compute]) -> str:
    """The machine cache's key: the machine, torch, the device, the workload and the candidates."""
    return f"{machine_name(device)}|torch {torch.__version__}|{device.type}|{key}|{','.join(o.name for o in options)}"


def cache_path() -> Path:
    return Path(os.environ.get("FEDCME_CACHE_DIR") or Path.home() / ".cache" / "fedcme") / "compute.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no cache yet, or a damaged one: calibrate again
    return values if isinstance(values, dict) else {}


def _cached_choice(values: dict[str, Any], key: str) -> ComputeChoice | None:
    try:
        choice = ComputeChoice.from_json(values[key])
    except (KeyError, TypeError, ValueError):
        return None  # not cached, or a damaged entry: calibrate again
    choice.chosen_by = "machine cache"
    return choice


def _keep_first(path: Path, key: str, choice: ComputeChoice) -> ComputeChoice:
    """The machine's choice for `key`: the one another process cached while this one calibrated (the
    first calibration wins, so that fresh runs started together still choose alike), else `choice`,
    now cached. The cache is read and written under a file lock beside it."""
    lock = FileLock(path.with_name(path.name + ".lock"))
    try:
        if not lock.acquire(timeout=30):
            return choice  # a holder that hangs: the choice is still recorded in the run directory
        try:
            values = _read_cache(path)
            first = _cached_choice(values, key)
            if first is not None:
                return first
            values[key] = choice.to_json()
            atomic_write_bytes(path, (json.dumps(values, indent=2, sort_keys=True) + "\n").encode("utf-8"))
        finally:
            lock.release()
    except OSError:
        pass  # a read-only home: the choice is still recorded in the run directory
    return choice


def time_candidates(step, options: list[Compute]) -> dict[str, float]:
    """Samples/s of each option, `step(option)` -> samples trained; interleaved, best repeat kept.
    A repeat is CALIBRATION_STEPS steps, fewer (at least one) once they took CALIBRATION_SECONDS."""
    best: dict[str, float] = {}
    for option in options[1:]:
        step(option)  # warm-up: oneDNN primitives and allocations (the first option's is done)
    for _ in range(CALIBRATION_REPEATS):
        for option in options:
            started = time.perf_counter()
            samples = 0
            for _ in range(CALIBRATION_STEPS):
                samples += step(option)
                if time.perf_counter() - started >= CALIBRATION_SECONDS:
                    break
            rate = samples / max(time.perf_counter() - started, 1e-9)
            best[option.name] = max(best.get(option.name, 0.0), rate)
    return best


def resolve(channels_last: bool | str, precision: str, device: torch.device, key: str, step) -> ComputeChoice:
    """The run's choice: fixed by the config, or the fastest candidate by `step` (cached per machine).

    `key` names the workload (model, batch shape, threads); `step(option)` trains one batch in
    `option` and returns its sample count. The choice carries the device's record
    (:func:`~fedcme_core.client.device_flags.device_record`, which also sets the device's flags for
    the chosen precision).
    """
    choice = _resolve(channels_last, precision, device, key, step)
    choice.device = device_record(device, choice.compute.precision)
    return choice


def _resolve(channels_last: bool | str, precision: str, device: torch.device, key: str, step) -> ComputeChoice:
    options = candidates(channels_last, precision, device)
    machine = machine_name(device)
    if len(options) == 1:
        return ComputeChoice(options[0], "config", machine=machine)
    full_key = cache_key(device, key, options)
    path = cache_path()
    cached = _cached_choice(_read_cache(path), full_key)
    if cached is not None:
        return cached
    step(options[0])  # torch's one-time start-up (2 s here), which the run's first step would pay: not counted
    started = time.perf_counter()
    rates = time_candidates(step, options)
    fastest = max(options, key=lambda option: rates[option.name])
    return _keep_first(path, full_key,
                       ComputeChoice(fastest, "calibration", rates, time.perf_counter() - started, machine))
