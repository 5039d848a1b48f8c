"""Shared fixtures: the session's Prefect server, MLflow and Prefect stores set up once, the offline data
mirror, and small synthetic experiment configs and their finished runs."""

from __future__ import annotations

import atexit
import copy
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from contextlib import closing
from pathlib import Path

import pytest
import torch

from fedcme_core.config.schema import config_from_dict
from fedcme_core.config.files import apply_overrides

REPO_ROOT = Path(__file__).resolve().parents[1]

# Small CPU tests: one intra-op thread avoids oversubscribing CI's two cores.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def prefect_server():
    """A real Prefect server for the session (prefect_test_harness); yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


SET_UP_PREFECT_HOME = """
from flows.orchestration.prefect_server import TemporaryServer
server = TemporaryServer()
server.wait_ready(300)
server.stop()
"""


class UsedStores:
    """The stores a command sets up on its first use, as it leaves them, made once per test session.

    MLflow's sqlite schema costs 5-9 s of migrations in every fresh store, and a temporary Prefect
    server's first start on a fresh PREFECT_HOME another 5 s or so (its database's migrations).
    Tests whose subject is not that first set-up get copies (`seed`), which the commands then open
    as on any later use; the tests of a fresh store or home (several commands setting it up at
    once, a set-up killed midway) seed nothing."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._lock = threading.RLock()

    def folder(self) -> Path:
        with self._lock:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="fedcme-test-stores-"))
                atexit.register(shutil.rmtree, self._folder, True)
            return self._folder

    def mlflow_schema(self) -> Path:
        """A sqlite file with MLflow's schema, migrated by MLflow, and nothing in it: the store's first
        opening adds the default experiment (with its own artifact location) and the first-use record."""
        from mlflow.store.db import utils

        migrate = getattr(utils._initialize_tables, "migrations", utils._initialize_tables)
        with self._lock:
            path = self.folder() / "mlflow-schema.db"
            if not path.exists():
                import sqlalchemy

                partial = path.with_name(path.name + ".partial")
                partial.unlink(missing_ok=True)
                engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
                try:
                    migrate(engine)
                finally:
                    engine.dispose()
                os.replace(partial, path)
            return path

    def prefect_home(self) -> Path:
        """A PREFECT_HOME whose database a temporary server (flows.orchestration.prefect_server) has set up, then stopped."""
        with self._lock:
            home = self.folder() / "prefect-home"
            if not home.exists():
                partial = home.with_name("prefect-home.partial")
                shutil.rmtree(partial, ignore_errors=True)
                environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
                environment.update(PREFECT_HOME=str(partial), PYTHONPATH=str(REPO_ROOT))
                subprocess.run([sys.executable, "-c", SET_UP_PREFECT_HOME], cwd=REPO_ROOT, env=environment,
                               check=True, capture_output=True, timeout=600)
                with closing(sqlite3.connect(partial / "prefect.db")) as database:  # the WAL into the file
                    database.execute("pragma wal_checkpoint(TRUNCATE)")
                os.replace(partial, home)
            return home

    def seed(self, prefect_home: Path | None = None, mlflow_db: Path | None = None) -> None:
        """Copies of the set-up stores where a command will look for them (what is there already is kept)."""
        if prefect_home is not None and not prefect_home.exists():
            shutil.copytree(self.prefect_home(), prefect_home)
        if mlflow_db is not None and not mlflow_db.exists():
            mlflow_db.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.mlflow_schema(), mlflow_db)


USED_STORES = UsedStores()


@pytest.fixture(scope="session", autouse=True)
def mlflow_schema_built_once():
    """MLflow's schema migrations run once per test session, not once per fresh sqlite store.

    Most tests open a fresh sqlite store of their own (5-9 s of alembic migrations each,
    ``_initialize_tables``). Here the first one is migrated for real (USED_STORES.mlflow_schema),
    and every fresh store of this process gets its pages (sqlite's backup API) in place of the
    migrations: the same tables, indexes and alembic revision. The rest of the store's opening is
    MLflow's and the project's own, as before (the default experiment with this store's artifact
    location, flows.tracking.store's aside-and-rename and first-use lock). Commands started as
    subprocesses migrate their stores themselves (unless a test seeds them, UsedStores.seed)."""
    from mlflow.store.db import utils

    def initialize_tables(engine) -> None:
        if engine.url.get_backend_name() != "sqlite":
            initialize_tables.migrations(engine)
            return
        connection = engine.raw_connection()
        try:
            with closing(sqlite3.connect(USED_STORES.mlflow_schema())) as source:
                source.backup(connection.driver_connection)
        finally:
            connection.close()

    initialize_tables.migrations = utils._initialize_tables  # MLflow's own
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "_initialize_tables", initialize_tables)
        yield


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The offline dataset mirror (../shared/data beside the checkout, or FEDCME_DATA_MIRROR)."""
    path = Path(os.environ.get("FEDCME_DATA_MIRROR") or REPO_ROOT.parent / "shared" / "data")
    assert (path / "fashion-mnist").is_dir() and (path / "cifar-10").is_dir(), f"no data mirror at {path}"
    return path


SYNTHETIC = {
    "seed": 3,
    "device": "cpu",
    "data": {"dataset": "synthetic", "synthetic": {"num_train": 240, "num_test": 100, "shape": [1, 28, 28], "noise": 1.0}},
    "partition": {"method": "dirichlet", "alpha": 0.5, "min_size": 10},
    "federation": {"num_clients": 6, "clients_per_round": 4, "rounds": 2},
    "training": {"local_epochs": 2, "batch_size": 32},
    "model": {"name": "fmnist_cnn"},
    "algorithm": {"name": "fedcme", "mu": 0.1},
}


def build_synthetic_config(overrides: dict | None = None, algorithm: dict | None = None):
    values = dict(SYNTHETIC)
    if algorithm is not None:
        values["algorithm"] = algorithm
    return config_from_dict(apply_overrides(values, overrides or {}))


@pytest.fixture
def synthetic_config():
    """Build a small synthetic-data config; dotted overrides like {"algorithm.name": "fedavg"}."""
    return build_synthetic_config


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A finished run of a synthetic config, shared by the tests that only read it.

    `finished_run(overrides, algorithm)` takes synthetic_config's arguments and returns (the run's
    history, its run directory); each config (compared by its validated values) is run once per
    session, the first time a test asks for it. Runs are seeded and deterministic, so it is the
    history and the model a run of that config in the test's own directory would give. A test that
    resumes, extends or damages a run needs a run of its own."""
    from fedcme_core.rounds import run_experiment

    runs: dict[str, tuple[list, Path]] = {}

    def run(overrides: dict | None = None, algorithm: dict | None = None) -> tuple[list, Path]:
        config = build_synthetic_config(overrides, algorithm)
        key = config.model_dump_json()
        if key not in runs:
            run_dir = tmp_path_factory.mktemp("finished-run") / "run"
            runs[key] = (run_experiment(config, run_dir), run_dir)
        history, run_dir = runs[key]
        return copy.deepcopy(history), run_dir

    return run


def slow_files_first(nodeids: list[str], slow: set[str]) -> list[str]:
    """`nodeids` with the files that hold the most `slow` tests first (a stable sort: within a file,
    and among files with as many, the collection's order)."""
    per_file: dict[str, int] = {}
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        per_file[path] = per_file.get(path, 0) + (nodeid in slow)
    return sorted(nodeids, key=lambda nodeid: -per_file[nodeid.split("::", 1)[0]])


@pytest.hookimpl(trylast=True)  # after `-m` has deselected
def pytest_collection_modifyitems(config, items):
    """`make test` runs the suite in two processes (pytest-xdist: `-n 2 --dist loadfile
    --no-loadscope-reorder`), each test file whole in one of them (a file's shared fixture, such as
    the pipeline tests' finished grid, is built once), handed out in this order: the files with the
    most slow tests first, so that no long file is left to the end, keeping one process busy while
    the other idles. Only the test processes reorder (`workerinput`); a plain `pytest` keeps the
    files' order, and the quick tier (no slow test selected) lets pytest-xdist order the files by
    their number of tests."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.nodeid for item in items if item.get_closest_marker("slow")}
    order = {nodeid: index for index, nodeid in enumerate(slow_files_first([item.nodeid for item in items], slow))}
    items.sort(key=lambda item: order[item.nodeid])
