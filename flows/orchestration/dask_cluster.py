"""The local Dask cluster of the ``dask`` runner: worker processes that train at full speed.

Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_=65536`` in every worker process it spawns
(``distributed.nanny.pre-spawn-environ``). Setting any glibc malloc threshold switches off glibc's
dynamic mmap threshold, so every activation and gradient buffer above 128 KiB is mmap-ed and
unmapped again at each training step and its pages faulted in anew, which slows local training
(BENCHMARKS.md, "Dask workers keep glibc's malloc defaults", gives by how much). Our workers leave glibc's
defaults alone (dask documents a ``None`` value as "do not set"); the nanny's other
variables (``OMP_NUM_THREADS=1`` and the like) stay.

With ``runner.dask_address`` the workers are someone else's processes, possibly on other
machines: :func:`probe_workers` asks each, before the run starts, whether it runs the same
fedcme code, sees the run directory, can load the run's data and has the configured device (CUDA
is probed on the workers, not on the driver), and names the first that cannot; :func:`one_device`
refuses workers that resolve ``device`` differently.

With ``device: cuda`` a local cluster starts the workers that :func:`gpu_worker_environments`
lays out: one per visible GPU unless ``runner.workers`` says otherwise, each pinned to its GPU by
CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import dask
from distributed import LocalCluster

from fedcme_core.client.device_flags import WORKSPACE
from flows.common.errors import OrchestratorError

PACKAGES = ("fedcme_core", "flows")

WORKER_ENVIRONMENT = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def local_cluster(worker_environments: list[dict[str, str]] | None = None, **cluster_kwargs: Any) -> LocalCluster:
    """A ``distributed.LocalCluster(**cluster_kwargs)`` whose worker processes keep glibc's malloc defaults.

    `worker_environments` (:func:`gpu_worker_environments`): one worker process per entry, each
    with that entry in its environment (its CUDA_VISIBLE_DEVICES); ``n_workers`` is then theirs."""
    with dask.config.set(WORKER_ENVIRONMENT):
        if not worker_environments:
            return LocalCluster(**cluster_kwargs)
        cluster = LocalCluster(**{**cluster_kwargs, "n_workers": 0})
        for environment in worker_environments:
            ((name, spec),) = cluster.new_worker_spec().items()
            options = dict(spec["options"])
            options["env"] = {**options.get("env", {}), **environment}
            cluster.worker_spec[name] = {**spec, "options": options}
        cluster.sync(cluster._correct_state)
        cluster.wait_for_workers(len(worker_environments))
        return cluster


def gpu_worker_environments(gpu_count: int, workers: int | None = None,
                            visible: str | None = None) -> list[dict[str, str]]:
    """The environment of each local Dask worker of a run with ``device: cuda``: `workers` of them
    (None: one per visible GPU), worker i pinned to GPU i mod `gpu_count` through
    CUDA_VISIBLE_DEVICES (the ids of `visible`, this process's CUDA_VISIBLE_DEVICES, when set), and
    CUBLAS_WORKSPACE_CONFIG set before the worker's cuBLAS first runs. One worker per GPU holds one
    CUDA context and one copy of the training set per GPU; more share their GPU."""
    if gpu_count < 1:
        raise OrchestratorError("device: cuda with the dask runner, but this machine has no visible GPU")
    ids = [part.strip() for part in visible.split(",") if part.strip()] if visible else []
    ids = (ids or [str(index) for index in range(gpu_count)])[:gpu_count]
    return [{"CUDA_VISIBLE_DEVICES": ids[index % len(ids)], "CUBLAS_WORKSPACE_CONFIG": WORKSPACE}
            for index in range(workers or len(ids))]


def worker_device(setting: str) -> str:
    """On a Dask worker: the device type `setting` resolves to there ("cpu" or "cuda"), or why it cannot."""
    from fedcme_core.client.models import resolve_device

    try:
        return resolve_device(setting).type
    except ValueError as error:
        return f"error: {error}"


def one_device(answers: dict[str, str], setting: str) -> str:
    """The device every worker resolves `setting` to (so that a round never mixes devices); raises
    OrchestratorError naming the first worker that cannot, or two workers that differ."""
    for worker, answer in sorted(answers.items()):
        if answer.startswith("error: "):
            raise OrchestratorError(f"Dask worker {worker}: {answer[len('error: '):]}")
    devices = {answer: worker for worker, answer in sorted(answers.items(), reverse=True)}
    if len(devices) > 1:
        (first, one), (second, other) = sorted(devices.items())[:2]
        raise OrchestratorError(f"Dask workers resolve device: {setting} differently ({one}: {first}, {other}: "
                                f"{second}); a round must not mix devices: set device: cpu or cuda, or use "
                                "workers of one kind")
    return next(iter(devices))


def code_digest() -> str:
    """SHA-256 over the sources of the project's packages as this process imports them."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        root = Path(__import__(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root.parent).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def worker_problem(marker: str, config_values: dict[str, Any], digest: str) -> str | None:
    """On a Dask worker: why it cannot take part in the run (same code, the run directory, the data), or None."""
    theirs = code_digest()
    if theirs != digest:
        return (f"runs other fedcme code (source sha256 {theirs[:12]}, this command's {digest[:12]}); "
                "install the same version on every worker")
    if not Path(marker).is_file():
        return (f"cannot see {Path(marker).parent}: the runs directory must be on storage every worker sees, "
                "at the same path")
    from fedcme_core.config.schema import config_from_dict
    from fedcme_core.rounds import load_experiment_dataset

    config = config_from_dict(config_values)
    device = worker_device(config.device)
    if device.startswith("error: "):  # device: cuda on a worker without a GPU
        return f"{device[len('error: '):]} on this worker"
    try:
        load_experiment_dataset(config.data, config.seed)
    except Exception as error:  # the worker's own reason, whatever it is, for the one line
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"cannot load the run's data from its working directory {Path.cwd()}: {reason}"
    return None


def probe_workers(address: str, config, runs_dir: Path, timeout: float = 30.0) -> int:
    """Check every worker of the scheduler at `address` before a run; returns how many answered.

    Raises :class:`OrchestratorError` naming the first worker that cannot take part."""
    from distributed import Client

    runs_dir.mkdir(parents=True, exist_ok=True)
    marker = runs_dir.resolve() / f".worker-probe-{uuid.uuid4().hex}"
    marker.write_text("fedcme\n", encoding="utf-8")
    try:
        with Client(address, timeout=timeout) as client:
            answers = client.run(worker_problem, str(marker), config.model_dump(mode="json"), code_digest(),
                                 on_error="return")
    except OSError as error:
        raise OrchestratorError(f"Dask scheduler {address}: not reachable ({error})") from None
    finally:
        marker.unlink(missing_ok=True)
    if not answers:
        raise OrchestratorError(f"Dask scheduler {address}: no workers")
    problems = {worker: answer if isinstance(answer, str) else f"{type(answer).__name__}: {answer}"
                for worker, answer in sorted(answers.items()) if answer is not None}
    if problems:
        worker, problem = next(iter(problems.items()))
        more = f" (and {len(problems) - 1} more workers)" if len(problems) > 1 else ""
        raise OrchestratorError(f"Dask worker {worker}: {problem}{more}")
    return len(answers)
