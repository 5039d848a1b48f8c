"""Errors of the orchestration layer (importable without prefect or mlflow)."""

from __future__ import annotations


class TrackingError(RuntimeError):
    """The MLflow tracking store cannot be used; the message names it."""


class OrchestratorError(RuntimeError):
    """Prefect's server, or a Dask scheduler or worker, cannot be used; the message says why."""
