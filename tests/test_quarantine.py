"""A damaged server state is moved aside under a name that never replaces an earlier one
(``round-XXXX.pt.corrupt-<UTC time>``), and when no kept state is intact nothing is moved."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from fedcme_core.common.checkpoints import CheckpointError
from fedcme_core.rounds import RecoveryWarning, RunPaths, completed_rounds, run_experiment, store


def damage(path, keep: int = 1000) -> bytes:
    """Truncate `path` to `keep` bytes; returns what it holds now."""
    path.write_bytes(path.read_bytes()[:keep])
    return path.read_bytes()


def test_both_kept_states_corrupt_is_one_error_naming_both_and_moves_nothing(tmp_path, synthetic_config):
    run_dir = tmp_path / "run"
    run_experiment(synthetic_config({"federation.rounds": 2}), run_dir)
    paths = RunPaths(run_dir)
    earlier = paths.server_state(2).with_name("round-0002.pt.corrupt-20260101T000000000000Z")
    earlier.write_bytes(b"an earlier incident's file")
    latest, before = damage(paths.server_state(2), 900), damage(paths.server_state(1), 800)

    with pytest.raises(CheckpointError) as raised:
        run_experiment(synthetic_config({"federation.rounds": 3}), run_dir)

    message = str(raised.value)
    assert "\n" not in message
    assert "round-0002.pt: content hash mismatch" in message and "round-0001.pt: content hash mismatch" in message
    assert message.endswith("no earlier intact round to resume from")
    assert paths.server_state(2).read_bytes() == latest and paths.server_state(1).read_bytes() == before
    assert earlier.read_bytes() == b"an earlier incident's file"
    assert sorted(path.name for path in paths.server_state(0).parent.iterdir()) == [
        "round-0001.pt", "round-0002.pt", earlier.name]


def test_a_second_quarantine_of_the_same_round_keeps_the_first(tmp_path, synthetic_config):
    run_dir = tmp_path / "run"
    config = synthetic_config({"federation.rounds": 2})
    run_experiment(config, run_dir)
    paths = RunPaths(run_dir)
    contents = []
    for incident in range(2):  # the latest state damaged, the round redone, damaged again
        contents.append(damage(paths.server_state(2), 700 + incident))
        with pytest.warns(RecoveryWarning, match=r"round-0002\.pt: .*moved to round-0002\.pt\.corrupt-\d{8}T\d+Z"):
            run_experiment(config, run_dir)
        assert completed_rounds(run_dir) == 2

    kept = sorted(paths.server_state(0).parent.glob("round-0002.pt.corrupt-*"))
    assert len(kept) == 2
    assert sorted(path.read_bytes() for path in kept) == sorted(contents)


def test_a_quarantine_name_already_taken_gets_the_next_free_one(tmp_path, monkeypatch):
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 12, 8, 9, 30, tzinfo=timezone.utc)

    monkeypatch.setattr(store, "datetime", Frozen)
    taken = tmp_path / "round-0003.pt.corrupt-20261208T093000000000Z"
    taken.write_bytes(b"first")
    for content in (b"second", b"third"):
        (tmp_path / "round-0003.pt").write_bytes(content)
        store.quarantine(tmp_path / "round-0003.pt")

    assert not (tmp_path / "round-0003.pt").exists()
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == {
        taken.name: b"first", f"{taken.name}-2": b"second", f"{taken.name}-3": b"third"}
