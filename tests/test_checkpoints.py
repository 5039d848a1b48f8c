"""The checkpoint format (fedcme_core.common.checkpoints): header, digest, torch body, atomic replacement."""

from __future__ import annotations

import hashlib
import io
import pickle

import pytest
import torch

from fedcme_core.common.atomic import atomic_writer
from fedcme_core.common.checkpoints import (
    MAGIC,
    CheckpointError,
    checkpoint_bytes,
    load_checkpoint,
    save_checkpoint,
)


class NotATensor:
    """A class a pickle-based loader would instantiate; weights_only must refuse it."""


def test_file_is_magic_then_sha256_of_the_body_then_a_torch_save_body(tmp_path):
    payload = {"model": {"w": torch.arange(4.0)}, "round": 3}

    save_checkpoint(payload, tmp_path / "c.pt")

    content = (tmp_path / "c.pt").read_bytes()
    assert MAGIC == b"FEDCME-CHECKPOINT-1\n" and content.startswith(MAGIC)
    digest, body = content[len(MAGIC):len(MAGIC) + 32], content[len(MAGIC) + 32:]
    assert hashlib.sha256(body).digest() == digest
    loaded = torch.load(io.BytesIO(body), weights_only=True)
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and loaded["round"] == 3
    assert content == checkpoint_bytes(payload)  # the same payload gives the same bytes
    assert (tmp_path / "c.pt").stat().st_mode & 0o777 == 0o644


def test_round_trip_keeps_tensors_and_plain_containers(tmp_path):
    payload = {"model": {"a": torch.randn(2, 3), "b": torch.tensor([1, 2], dtype=torch.int64)},
               "history": [{"round": 0, "pairs": [[0, 1]]}], "features": None}

    save_checkpoint(payload, tmp_path / "c.pt")
    loaded = load_checkpoint(tmp_path / "c.pt")

    assert set(loaded) == set(payload) and loaded["history"] == payload["history"] and loaded["features"] is None
    assert all(torch.equal(loaded["model"][key], payload["model"][key]) for key in payload["model"])


def test_a_pickled_object_in_a_valid_envelope_is_refused(tmp_path):
    buffer = io.BytesIO()
    torch.save({"model": NotATensor()}, buffer, pickle_module=pickle)
    body = buffer.getvalue()
    (tmp_path / "evil.pt").write_bytes(MAGIC + hashlib.sha256(body).digest() + body)

    with pytest.raises(CheckpointError, match=r"evil\.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "evil.pt")


def test_a_top_level_that_is_not_a_dict_is_named(tmp_path):
    (tmp_path / "list.pt").write_bytes(_envelope([1, 2]))

    with pytest.raises(CheckpointError, match=r"list\.pt: not a checkpoint written by fedcme \(top level is list\)"):
        load_checkpoint(tmp_path / "list.pt")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"absent\.pt: checkpoint not found"):
        load_checkpoint(tmp_path / "absent.pt")


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    save_checkpoint({"version": 1}, tmp_path / "c.pt")

    with pytest.raises(RuntimeError), atomic_writer(tmp_path / "c.pt") as handle:
        handle.write(b"half a file")
        raise RuntimeError("crash mid-write")

    assert load_checkpoint(tmp_path / "c.pt") == {"version": 1}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.pt"]


def _envelope(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    body = buffer.getvalue()
    return MAGIC + hashlib.sha256(body).digest() + body


class OnGpu(torch.Tensor):
    """A tensor that says it is on CUDA, as a GPU run's weights and optimizer buffers are (its values
    live on the CPU, so the test runs without a GPU); moving it to the CPU gives a plain tensor."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).clone()


def test_every_checkpoint_holds_only_cpu_tensors_whatever_the_run_trained_on(tmp_path):
    """A swap checkpoint of a GPU run held the optimizer's CUDA momentum buffers, which a plain
    torch.load cannot read on a machine without a GPU; every tensor is now saved from the CPU."""
    from fedcme_core.client.training import save_local_run

    from .helpers import fresh_run, tiny_client_data, train

    run = train(fresh_run(), tiny_client_data(32), epochs=1)
    for state in run.optimizer.state.values():
        state["momentum_buffer"] = state["momentum_buffer"].as_subclass(OnGpu)
    on_gpu = {"model": {"w": torch.arange(3.0).as_subclass(OnGpu)}, "nested": [({"c": torch.ones(2).as_subclass(OnGpu)},)]}
    save_local_run(run, tmp_path / "swap.pt")
    save_checkpoint(on_gpu, tmp_path / "upload.pt")

    for name in ("swap.pt", "upload.pt"):
        body = (tmp_path / name).read_bytes()[len(MAGIC) + hashlib.sha256().digest_size:]
        payload = torch.load(io.BytesIO(body), weights_only=True)  # no map_location: as saved
        tensors = [value for value in _leaves(payload) if isinstance(value, torch.Tensor)]
        assert tensors and all(type(value) is torch.Tensor and value.device.type == "cpu" for value in tensors)
    loaded = load_checkpoint(tmp_path / "upload.pt")
    assert torch.equal(loaded["model"]["w"], torch.arange(3.0)) and torch.equal(loaded["nested"][0][0]["c"], torch.ones(2))


def test_a_cpu_payload_is_saved_byte_for_byte_as_torch_saves_it():
    payload = {"model": {"w": torch.arange(4.0)}, "optimizer": {"state": {0: {"b": torch.ones(2)}}, "groups": [1, (2, 3)]}}
    buffer = io.BytesIO()
    torch.save(payload, buffer)

    assert checkpoint_bytes(payload)[len(MAGIC) + hashlib.sha256().digest_size:] == buffer.getvalue()


def _leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value
