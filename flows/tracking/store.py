"""Opening an MLflow tracking store: its URI, a reachability check, the warm-up, and the
serialised first use of a sqlite store shared by several commands.

An unreachable tracking server is reported before training starts (:func:`check_reachable`,
seconds, not MLflow's minutes of retries). Several commands may share one sqlite store, a fresh
one included: MLflow creates (or migrates) its schema when a process first opens it, and
:func:`open_client` lets one process at a time do that (``flows.common.shared_stores.FirstUse``, a lock
file beside the database), a fresh schema built aside and renamed into place whole; later
commands open it side by side.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from flows.common.errors import TrackingError
from flows.common.shared_stores import FirstUse, is_busy, retry_busy, sqlite_file

SETUP_TIMEOUT = 120.0  # seconds a command waits for another's creation of a sqlite store's schema


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def absolute_uri(uri: str) -> str:
    """`uri` valid from any working directory: a relative sqlite file made absolute (others as they are)."""
    database = sqlite_file(uri)
    if database is None or database.is_absolute():
        return uri
    return f"sqlite:///{database.resolve()}"


def artifact_location(uri: str) -> str | None:
    """Artifacts of a sqlite store live beside its database file (not in the working directory)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


def sync_command(run_dir: Path | str, uri: str) -> str:
    """The `fedcme sync` command that logs `run_dir` into the store `uri`, as printed: complete
    (``--runs-dir``, ``--tracking-uri``) and absolute, so it works from any working directory."""
    run_dir = Path(run_dir).resolve()
    return shlex.join(["fedcme", "sync", "--experiment", run_dir.name, "--runs-dir", str(run_dir.parent),
                       "--tracking-uri", absolute_uri(uri)])


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Raise TrackingError at once when an http(s) tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return  # something answered: MLflow's own calls will tell what is wrong
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise TrackingError(
            f"MLflow tracking server {uri} is not reachable ({reason}); start it "
            "(mlflow server --host 127.0.0.1) or use --tracking-uri sqlite:///mlflow.db"
        ) from None


def warm_up(uri: str) -> threading.Thread | None:
    """Do now what the run needs of MLflow later, while the command waits for Prefect's server.

    Opens the store (for sqlite, its schema check: 1.3 s here; MLflow keeps the store per URI)
    and starts, on a daemon thread (returned), MLflow's map of installed distributions to modules,
    which ``log_model``'s requirement check builds after the last round (3 s here). MLflow has no
    public call for that map: where its helper is gone, the check builds it then, as before. A
    store that cannot be opened is left to :meth:`RunTracker.open`, which says what is wrong in
    one line."""
    from mlflow.utils import requirements_utils

    thread = None
    if build_map := getattr(requirements_utils, "_init_packages_to_modules_map", None):
        thread = threading.Thread(target=build_map, name="mlflow-packages", daemon=True)
        thread.start()
    try:
        open_client(uri).search_experiments(max_results=1)
    except Exception:  # noqa: BLE001 - reported by RunTracker.open, before any training
        pass
    return thread


_prepared: set[str] = set()  # the URIs whose store this process has opened


def open_client(uri: str, timeout: float = SETUP_TIMEOUT) -> MlflowClient:
    """An MlflowClient of `uri`. The first use of a sqlite store (MLflow creates or migrates its
    schema then) is serialised across processes by a lock beside the database (flows.common.shared_stores):
    commands started at once on a fresh store take turns for it; MLflow keeps the store per URI."""
    database = sqlite_file(uri)
    if database is None or uri in _prepared:
        return MlflowClient(tracking_uri=uri)
    setup = FirstUse(database.resolve(), "mlflow", mlflow.__version__)
    if setup.is_done():
        client = retry_busy(lambda: MlflowClient(tracking_uri=uri))
    else:
        if not setup.begin(timeout):
            raise TrackingError(f"MLflow tracking store {uri}: another command has been creating its schema for over "
                                f"{timeout:.0f} s (it holds {setup.lock.path}); try again when it has started")
        try:
            if not setup.database.exists():
                create_schema_aside(setup.database)
            client = retry_busy(lambda: MlflowClient(tracking_uri=uri))
        except BaseException:
            setup.abandon()
            raise
        setup.finish()
    _prepared.add(uri)
    return client


def create_schema_aside(database: Path) -> None:
    """Create a fresh sqlite store's schema in a file beside it (`mlflow.db.partial`) and rename it
    into place: MLflow's creation is not one transaction, and a command killed during it would
    leave a store that no command can open. Only under the store's first-use lock."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    partial = database.with_name(database.name + ".partial")
    partial.unlink(missing_ok=True)  # a killed creation's remains
    store = SqlAlchemyStore(f"sqlite:///{partial}", (database.parent / "mlartifacts").as_uri())
    store.engine.dispose()  # every connection closed before the file moves
    os.replace(partial, database)


def experiment_named(client: MlflowClient, name: str, uri: str) -> str:
    """The id of the MLflow experiment `name`, created if missing (by this or a concurrent command)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri))
    except Exception:
        found = client.get_experiment_by_name(name)  # another command created it meanwhile
        if found is None:
            raise
        return found.experiment_id


def reusable_run(client: MlflowClient, record_file: Path, uri: str) -> str | None:
    """The MLflow run a run directory's record (`mlflow.json`) names, when it is in the store `uri`; else None."""
    if not record_file.exists():
        return None
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if record.get("tracking_uri") != uri:
        return None
    try:
        retry_busy(lambda: client.get_run(record["run_id"]))
    except Exception as error:
        if is_busy(error):
            raise
        return None
    return record["run_id"]


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error).strip() else type(error).__name__


# MLflow retries an unanswered HTTP request for minutes by default; a run should learn sooner.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def reachable_client(uri: str) -> MlflowClient:
    """An MlflowClient of `uri`, once the store answers (:func:`check_reachable`: one TrackingError line
    when it does not), with MLflow's HTTP retries bounded by HTTP_DEFAULTS unless already set."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    check_reachable(uri)
    return open_client(uri)
