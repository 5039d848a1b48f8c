"""The base of every config model: frozen, unknown keys refused, no inf or nan.

In the ground floor because both the algorithms' own config classes (``fedcme_core.algorithms``)
and the experiment config above them (``fedcme_core.config``) are built on it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
