"""The model part of a run's MLflow tracking (:class:`flows.tracking.run.RunTracker` has these
methods): the final global model logged through ``mlflow.pytorch.log_model`` and named by the
experiment (``flows.tracking.names.model_name``), one current model per run, and on request a
version of it in MLflow's model registry."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import mlflow
import numpy as np
import torch

from flows.tracking.names import model_name

# What serving the logged model needs, stated (MLflow's own inference of it runs pip in a
# subprocess for many seconds per run).
PIP_REQUIREMENTS = [f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"]


class ModelLogging:
    """A tracker's model calls, each guarded like its others (``_guarded``: a failure is the
    tracker's one warning and None); the tracker holds ``client``, ``uri``, ``run_id`` and ``run_dir``."""

    def log_model(self, model, input_example: np.ndarray, rounds: int) -> str | None:
        """Log the global model after `rounds` rounds at that step, named by the run directory's
        experiment (``flows.tracking.names.model_name``); returns its model URI.

        Stored in MLflow's pickle form, so ``mlflow.pytorch.load_model`` gives the project's own
        model class, with ``features()`` and ``classify()`` (loading it runs code from the store:
        README, "Security"). One model per run is current: a model logged before it (a run
        extended later) is tagged ``fedcme.current=false`` with ``fedcme.superseded_by``."""

        def log() -> str:
            mlflow.set_tracking_uri(self.uri)
            # Its warning about the pickle form on every run says what README's "Security" says once.
            pytorch_logger = logging.getLogger("mlflow.pytorch")
            level = pytorch_logger.level
            pytorch_logger.setLevel(logging.ERROR)
            try:
                with mlflow.start_run(run_id=self.run_id):
                    info = mlflow.pytorch.log_model(
                        model, name=model_name(self.run_dir.name), input_example=input_example,
                        pip_requirements=PIP_REQUIREMENTS, serialization_format="pickle", step=rounds,
                        tags={"fedcme.current": "true", "fedcme.rounds": rounds},
                    )
            finally:
                pytorch_logger.setLevel(level)
            experiment_id = self.client.get_run(self.run_id).info.experiment_id
            earlier = self.client.search_logged_models(
                [experiment_id], filter_string=f"source_run_id = '{self.run_id}'")
            for logged in earlier:
                if logged.model_id != info.model_id and logged.tags.get("fedcme.current") != "false":
                    self.client.set_logged_model_tags(
                        logged.model_id, {"fedcme.current": "false", "fedcme.superseded_by": info.model_id})
            self.client.set_tag(self.run_id, "model_uri", info.model_uri)
            return info.model_uri

        return self._guarded("logging the model", log)

    def logged_model_uri(self) -> str | None:
        run = self._guarded("reading the run", lambda: self.client.get_run(self.run_id))
        return None if run is None else run.data.tags.get("model_uri")

    def register_model(self, name: str, model_uri: str, tags: Mapping[str, Any]) -> str | None:
        """Register `model_uri` as a new version of the registered model `name` (created if
        missing), with version `tags`; returns the version's number."""

        def register() -> str:
            mlflow.set_tracking_uri(self.uri)
            mlflow.set_registry_uri(self.uri)
            version = mlflow.register_model(model_uri, name, tags={key: str(value) for key, value in tags.items()})
            return str(version.version)

        return self._guarded(f"registering the model {name!r}", register)
