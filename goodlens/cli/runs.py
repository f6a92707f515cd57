"""``goodlens end-run``: end a run whose job is gone without an end event.

A run in progress is accounted to now. When its job died without a word (a node lost with
its launcher, a collector that was down when it hung, a trace imported without its end),
the live hang detector never recorded the end, and the run's wall-clock would grow forever
as ``other: since_last_step``. ``goodlens report`` says when a run is silent past the
timeout its own step rhythm gives; this command records the end the hang detector would
have: a ``failure_detected`` event at the last activity plus that timeout (or ``--at``),
so the tail is accounted as restart detection and the wall-clock stops there.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from typing import Any

import click

from goodlens.cli.common import (
    CollectorError,
    CollectorUrl,
    Duration,
    StoreSpec,
    echo_json,
    get_json,
    open_store,
    read_run,
    read_token,
    token_options,
)
from goodlens.model.schema import SCHEMA_VERSION, EventKind
from goodlens.model.units import format_duration, format_instant, parse_instant


@click.command("end-run")
@click.option("--db", "--store", "db", type=StoreSpec(exists=True),
              help="Store to write to (a DuckDB file no collector holds, or parquet:DIR).")
@click.option("--url", type=CollectorUrl(),
              help="A running collector to send the event to instead.")
@token_options("token for --url")
@click.option("--run", "run_id", required=True, help="Run id.")
@click.option("--cause", default="lost", show_default=True,
              help="Cause recorded with the failure (hang, lost, node_failure, ...).")
@click.option("--at", "at", help="When the run ended: epoch s, ISO time, +2h (into the run); "
                                 "default: its last activity plus its hang timeout.")
@click.option("--hang-floor", type=Duration(), default="60s", show_default=True,
              help="Shortest hang timeout, as `goodlens serve --hang-floor` (with --url, the "
                   "collector's own).")
@click.option("--force", is_flag=True,
              help="End it even though it is not silent past its timeout yet: at its last "
                   "activity plus the timeout, or now if that is still to come.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def end_run(db: str | None, url: str | None, token: str | None, token_file: str | None,
            run_id: str, cause: str, at: str | None, hang_floor: float, force: bool,
            as_json: bool) -> None:
    """End a run in progress whose job is gone: record a failure at its last activity
    plus its hang timeout (what the live hang detector records), so its wall-clock stops.

    A run that has ended is refused; the event is keyed by the attempt, so two end-runs
    racing store it once."""
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH or --url URL")
    token = read_token(token, token_file)
    rep = _report(db, url, token, run_id, hang_floor)
    if not rep["in_progress"]:
        raise click.ClickException(f"run {run_id!r} has already ended; nothing to do")
    quiet = rep["silence"]
    if not quiet["silent"] and not force:
        raise click.ClickException(
            f"run {run_id!r} reported {format_duration(quiet['silent_s'])} ago, within its "
            f"{format_duration(quiet['timeout_s'])} hang timeout: it may still be running "
            "(--force ends it anyway)")
    now = time.time()  # an end is never recorded later than this (--force ends it now)
    when = min(quiet["last_activity"] + quiet["timeout_s"], now)
    if at is not None:
        try:
            when = parse_instant(at, rep["start"], now)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--at") from None
        if when < quiet["last_activity"]:
            raise click.BadParameter("is before the run's last activity", param_hint="--at")
        if when > now:
            raise click.BadParameter(f"{format_instant(when)} is in the future; the end of a "
                                     "run is recorded at or before now (leave --at out: now "
                                     "with --force)", param_hint="--at")
    attempt = int(quiet["attempt"])
    doc = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "events": {
        "source": f"goodlens/end-run/{attempt}", "seq": [0], "kind": [EventKind.FAILURE_DETECTED],
        "time": [when], "attempt": attempt, "cause": [cause],
        "label": ["end-run"]}}
    if url:
        answer = get_json(url.rstrip("/") + "/v1/ingest", token, body=doc)
        stored = int((answer or {}).get("events_inserted", 0))
        with contextlib.suppress(CollectorError):  # summarised too, so the report below has it
            get_json(url.rstrip("/") + "/v1/sync", token, body={})
    else:
        stored = _write(db, doc)
    after = _report(db, url, token, run_id, hang_floor)
    out = {"run": run_id, "attempt": attempt, "cause": cause, "time": when,
           "stored": bool(stored), "wall_clock_s": after["wall_clock_s"],
           "in_progress": after["in_progress"]}
    if as_json:
        echo_json(out)
        return
    verb = "ended" if stored else "was already ended by an earlier end-run"
    click.echo(f"run {run_id} attempt {attempt} {verb} at {format_instant(when)} (cause {cause}); "
               f"wall-clock now {format_duration(after['wall_clock_s'])}")


def _report(db: str | None, url: str | None, token: str | None, run_id: str,
            hang_floor_s: float) -> dict[str, Any]:
    if url:
        return get_json(url.rstrip("/") + "/v1/report?" + urllib.parse.urlencode(
            {"run": run_id, "fresh": "1"}), token)  # computed now, not a cached one
    from goodlens.analysis.report import report_dict
    return read_run(db, run_id, lambda store, run: report_dict(store, run,
                                                                 hang_floor_s=hang_floor_s))


def _write(db: str, doc: dict[str, Any]) -> int:
    from goodlens.model.batch import validate_batch
    from goodlens.storage.store import StoreWriteError
    store = open_store(db, read_only=False)
    try:
        res = store.write_group([validate_batch(doc)])
    except StoreWriteError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        store.close()
    return res[0].events_inserted

