"""A run directory belongs to one process at a time: the lock itself is
:mod:`fedcme_core.common.run_lock` (no torch, so a command takes it in its first second), named
here where the round's modules and the commands have always found it."""

from __future__ import annotations

from fedcme_core.common.run_lock import busy_message, hold_run, holder_record, run_lock_path

__all__ = ["busy_message", "hold_run", "holder_record", "run_lock_path"]
