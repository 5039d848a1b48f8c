"""Prefect: the training flow (train), its tasks (tasks), the temporary server and its task records, deployments,
the Dask cluster and the checks a run makes before it starts (preflight)."""
