"""Hygiene of long-lived Dask workers (issue 21): Prefect's event and API-log services on a worker
process keep the API URL of the first command that started them, so before a ``--dask`` command
(and its private Prefect API) exits, :func:`drain_workers` drains them on every worker
(:func:`pipelines.runtime.runner.run_cli_flow` calls it); :func:`prefect_services` shows what is live on a
worker (the cluster test asserts it is empty after three consecutive commands)."""
from __future__ import annotations

import sys


async def _drain_prefect_services() -> int:
    """On a Dask worker: flush and stop Prefect's event and API-log services, if Prefect ran
    there. Their instances are process-wide and keep the API URL they were created with (the
    events worker is keyed on its client type only), so a long-lived worker would send every
    later command's task events to the first command's API — a private server that has exited.
    Drained while the command's API is still up, the next command's tasks start fresh ones
    pointed at its own API. Returns the number of services drained."""
    import asyncio
    import logging

    if "prefect" not in sys.modules:
        return 0
    n = 0
    # "Still processing items: N remaining" while draining is progress, not news (as in the command)
    for name in ("EventsWorker", "APILogWorker"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for svc in (EventsWorker, APILogWorker):
        n += len(svc._instances)  # noqa: SLF001 - count only, for the caller's message
        waiter = svc.drain_all(timeout=15)
        if asyncio.iscoroutine(waiter) or isinstance(waiter, asyncio.Future):
            await waiter
    return n


def prefect_services() -> dict:
    """On a Dask worker: Prefect's live event and API-log services in this process — ``{"events":
    [API URL of each events client], "logs": count}`` (``{}`` when Prefect was never imported).
    After :func:`drain_workers` both are empty; a live one is what would carry the next command's
    task events to a finished command's API."""
    if "prefect" not in sys.modules:
        return {}
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    live = [i for i in EventsWorker._instances.values() if not i._stopped]  # noqa: SLF001
    return {"events": [str(getattr(getattr(i, "_client", None), "_api_url", None)) for i in live],
            "logs": sum(1 for i in APILogWorker._instances.values() if not i._stopped)}  # noqa: SLF001


def drain_workers(address: str) -> dict:
    """Run :func:`_drain_prefect_services` on every worker of the scheduler at ``address``
    (``{worker: services drained}``); called by :func:`pipelines.runtime.runner.run_cli_flow` when a
    command used ``--dask``, before the command (and its private API) exits."""
    from distributed import Client

    with Client(address, timeout=30, set_as_default=False) as c:
        return c.run(_drain_prefect_services)
