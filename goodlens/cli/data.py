"""``goodlens import``, ``goodlens replay`` and ``goodlens export``: traces in and out of a
store, offline or live through a collector (trace format: ``docs/trace-format.md``).
"""

from __future__ import annotations

import sys

import click

from goodlens.cli.common import (
    CollectorUrl,
    StoreSpec,
    echo_json,
    import_into,
    open_store,
    read_token,
    token_options,
    wait_healthy,
)

INIT_HELP = ("Add goodlens's tables to an existing DuckDB file that lacks them (another "
             "application's database); without it such a file is refused.")


@click.command("import")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--db", "--store", "db", required=True, type=StoreSpec(),
              help="Store file to load into (created if missing; no collector may hold it).")
@click.option("--init", is_flag=True, help=INIT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def import_cmd(trace: str, db: str, init: bool, as_json: bool) -> None:
    """Load a trace folder (Parquet, see docs/trace-format.md) into a store.

    All or nothing: the whole trace is checked first, and a trace with a missing or bad
    column imports nothing. Rows already stored are recognised and skipped, so importing
    twice adds nothing.
    """
    totals = import_into(db, trace, quiet=as_json, init=init)
    if as_json:
        echo_json(totals)
    else:
        click.echo(f"{trace}: {totals['runs']} run(s), {totals['steps_inserted']} step rows and "
                   f"{totals['events_inserted']} events stored ({totals['steps_duplicate']} and "
                   f"{totals['events_duplicate']} already present)")


@click.command()
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--db", "--store", "db", type=StoreSpec(),
              help="Load into this store file, offline (no collector may hold it).")
@click.option("--live", "url", type=CollectorUrl(),
              help="Stream through a running collector instead, e.g. http://127.0.0.1:8470.")
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="With --live: times faster than real time (60: a minute per second; "
                   "0: as fast as the collector takes it).")
@click.option("--as-now", is_flag=True,
              help="With --live: re-time the trace so it happens now, every row stamped at "
                   "or before the instant it is sent (a run still going reads as live). At "
                   "--speed 1 every instant moves by one amount, the trace starting now; at "
                   "--speed X it is also compressed X times (every instant and duration "
                   "divided by X: the shares of the report are the trace's, its durations "
                   "1/X); at --speed 0 it moves to end now.")
@token_options("token for --live")
@click.option("--init", is_flag=True, help="With --db: " + INIT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay(trace: str, db: str | None, url: str | None, speed: float, as_now: bool,
           token: str | None, token_file: str | None, init: bool, as_json: bool) -> None:
    """Replay a trace folder: offline into a store (--db), or live through a collector's
    ingest at --speed times real time (--live), as if the run were happening.

    Rows already stored are recognised and skipped, so replaying twice adds nothing.
    """
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH (offline) or --live URL")
    if as_now and not url:
        raise click.UsageError("--as-now shifts a live replay; use it with --live URL")
    ctx = click.get_current_context()
    if db and ctx.get_parameter_source("speed") != click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--speed paces a live replay (--live URL); --db loads the "
                               "whole trace at once: drop --speed, or replay through a "
                               "collector with --live URL --speed X")
    token = read_token(token, token_file)
    if db:
        totals = import_into(db, trace, quiet=as_json, init=init)
    else:
        from goodlens.collector.replay import stream_trace
        from goodlens.model.trace import TraceError, read_trace
        if speed < 0:
            raise click.BadParameter("must be >= 0", param_hint="--speed")
        try:
            t = read_trace(trace)
        except TraceError as exc:
            raise click.ClickException(str(exc)) from None
        wait_healthy(url)  # a dead collector: say so in seconds, not after the retries
        total = sum(x.num_rows for k, x in t.tables.items() if k in ("steps", "events"))
        with click.progressbar(length=total, label=f"replaying {trace} x{speed:g}",
                               file=sys.stderr, hidden=as_json or not sys.stderr.isatty()) as bar:
            try:
                totals = stream_trace(trace, url, speed=speed, token=token, progress=bar.update,
                                      as_now=as_now)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(totals)
    elif db:
        click.echo(f"{trace} -> {db}: {totals['steps_inserted']} step rows and "
                   f"{totals['events_inserted']} events stored ({totals['steps_duplicate']} "
                   f"and {totals['events_duplicate']} already present)")
    else:
        click.echo(f"{trace} -> {url}: {totals['steps']} step rows and {totals['events']} "
                   f"events in {totals['batches']} batches")


@click.command()
@click.option("--db", "--store", "db", type=StoreSpec(exists=True),
              help="Store file (no collector may hold it).")
@click.option("--url", type=CollectorUrl(),
              help="A running collector to read the runs from instead, e.g. 127.0.0.1:8470.")
@token_options("token for --url")
@click.option("--run", "run_ids", multiple=True, required=True, help="Run id (repeatable).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Trace folder to write.")
def export(db: str | None, url: str | None, token: str | None, token_file: str | None,
           run_ids: tuple[str, ...], out: str) -> None:
    """Write runs from a store (--db) or a running collector (--url) as a trace folder
    readable without goodlens."""
    from goodlens.cli.remote import fetch_run, one_source
    from goodlens.collector.replay import export_run
    from goodlens.model.trace import write_trace
    one_source(db, url)
    if url:
        tables = fetch_run(url, read_token(token, token_file), list(run_ids))
        click.echo(f"wrote {write_trace(out, tables, list(run_ids))}")
        return
    store = open_store(db)
    try:
        path = export_run(store, list(run_ids), out)
    except KeyError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    finally:
        store.close()
    click.echo(f"wrote {path}")
