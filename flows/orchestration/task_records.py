"""Whether Prefect's server stored every task run of a flow run: the temporary server stops with
the command, so ``fedcme train`` waits (bounded) for its records before it returns."""

from __future__ import annotations

import time
from uuid import UUID


def uses_temporary_server() -> bool:
    """True when this process's Prefect server stops with it: Prefect's own temporary server
    (no PREFECT_API_URL) or the one `fedcme train` started (flows.orchestration.prefect_server)."""
    from prefect.settings import PREFECT_API_URL

    from flows.orchestration.prefect_server import is_temporary

    return is_temporary(PREFECT_API_URL.value())


def recorded_task_runs(flow_run_id: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_filter = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
    page, offset = 200, 0
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=flow_filter, limit=page, offset=offset)
            offset += len(runs)
            if len(runs) < page:
                return offset


def wait_for_task_run_records(flow_run_id: str, expected: int, timeout: float = 20.0) -> int:
    """Wait (bounded) until the server has stored every task run of the flow run; returns how many it has."""
    deadline = time.monotonic() + timeout
    recorded = recorded_task_runs(flow_run_id)
    while recorded < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        recorded = recorded_task_runs(flow_run_id)
    return recorded
