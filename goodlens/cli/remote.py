"""A run's rows from a running collector, for the commands that compute over them.

Why it exists: a collector holds its DuckDB file, so ``goodlens detect``, ``goodlens plan
--run`` and ``goodlens export`` cannot open it while it runs. With ``--url`` they fetch the
run's tables from the collector (``GET /v1/tables/{name}?run=ID``, Arrow IPC) instead:
``export`` writes them as they come; ``detect`` and ``plan`` load them into a temporary store
and compute exactly as they would over the file (the same import path, the same reads).
"""

from __future__ import annotations

import contextlib
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from goodlens.cli.common import CollectorError, collector_url, get_bytes, open_store, read_run

if TYPE_CHECKING:  # pyarrow is imported to fetch from a collector: --db reads without it
    import pyarrow as pa

TRACE_TABLES = ("runs", "steps", "events", "attempts")


def fetch_table(url: str, token: str | None, name: str, run_id: str) -> pa.Table:
    """One table of ``run_id`` from the collector at ``url``; a run it does not hold is a
    one-line error saying how to list its runs."""
    import pyarrow as pa

    base = collector_url(url)
    query = urllib.parse.urlencode({"run": run_id})
    try:
        raw = get_bytes(f"{base}/v1/tables/{name}?{query}", token, timeout_s=300.0)
    except CollectorError as exc:
        if exc.status == 404 and "no run" in exc.message:
            raise click.ClickException(f"no run {run_id!r} at {base}; see `goodlens runs "
                                       f"--url {base}`") from None
        if exc.status == 404:
            raise click.ClickException(f"{base} has no /v1/tables (a goodlens collector "
                                       "older than this command?); stop it and use --db "
                                       "PATH, or upgrade it") from None
        raise
    try:
        return pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
    except pa.ArrowInvalid as exc:
        raise click.ClickException(f"{base} answered {name} of {run_id!r} with something "
                                   f"that is not an Arrow stream ({exc}); is it a goodlens "
                                   "collector?") from None


def fetch_run(url: str, token: str | None, run_ids: list[str]) -> dict[str, pa.Table]:
    """The trace tables of ``run_ids`` from the collector at ``url``, each concatenated."""
    import pyarrow as pa

    parts: dict[str, list[pa.Table]] = {name: [] for name in TRACE_TABLES}
    for run_id in run_ids:
        for name in TRACE_TABLES:
            parts[name].append(fetch_table(url, token, name, run_id))
    return {k: pa.concat_tables(v) for k, v in parts.items()}


@contextlib.contextmanager
def run_copy(url: str, token: str | None, run_id: str) -> Iterator[Any]:
    """A temporary store holding ``run_id`` as the collector at ``url`` has it (steps,
    events and the run's row, imported like a trace); removed afterwards."""
    from goodlens.collector.replay import import_trace
    from goodlens.model.trace import write_trace
    tables = fetch_run(url, token, [run_id])
    with tempfile.TemporaryDirectory(prefix="goodlens-url-") as tmp:
        trace = write_trace(Path(tmp) / "trace", {k: tables[k] for k in
                                                  ("runs", "steps", "events")}, [run_id])
        store = open_store(str(Path(tmp) / "copy.duckdb"), read_only=False)
        try:
            import_trace(store, trace)
            yield store
        finally:
            store.close()


def read_run_at(db: str | None, url: str | None, token: str | None, run_id: str,
                read: Callable[[Any, str], Any]) -> Any:
    """``read(store, run_id)`` over the store file ``db`` (opened read-only) or over a copy
    of the run the collector at ``url`` holds."""
    if url is None:
        return read_run(db, run_id, read)
    with run_copy(url, token, run_id) as store:
        return read(store, run_id)


def one_source(db: str | None, url: str | None) -> None:
    """Exactly one of ``--db`` and ``--url``, or a usage error (exit code 2)."""
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH or --url URL (a running "
                               "collector holds its store file: ask it with --url)")
