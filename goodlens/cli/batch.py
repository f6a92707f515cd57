"""``goodlens summarize`` and ``goodlens fleet``: batch jobs over a Parquet dataset.

``summarize`` brings the dataset's summary checkpoints (``DIR/summaries/``) up to date with
an engine: DuckDB in this process (what any reader's open does), or Spark (``--engine
spark``: local mode on this machine's cores by default, ``--master URL`` for a cluster) when
the rows are too many for one machine; every goodlens reader then starts from them instead
of summarising raw rows. ``fleet`` writes the fleet table, one row per run and attempt with
the report's numbers, as plain Parquet beside the dataset (docs/spark.md). Wiring only: the
passes are :mod:`goodlens.storage.bulk`'s, the rows :mod:`goodlens.analysis.fleet`'s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from goodlens.cli.common import (
    StoreSpec,
    dataset_errors,
    echo_json,
    open_store,
    verbose_option,
)
from goodlens.model.units import parse_instant

_ENGINE_HELP = ("What summarises the raw step rows: duckdb (this process) or spark (pyspark, "
                "`pip install 'goodlens[spark]'`, and a Java runtime 17+).")


def engine_options(f: Any) -> Any:
    """``--engine``, ``--master``, ``--conf`` and ``--verbose``."""
    f = verbose_option(f, expose=True)
    f = click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
                     help="A Spark setting (repeatable), e.g. spark.driver.memory=8g.")(f)
    f = click.option("--master", help="With --engine spark: the cluster's master URL "
                                      "(default local[*]: this machine's cores).")(f)
    return click.option("--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb",
                        show_default=True, help=_ENGINE_HELP)(f)


def engine_conf(confs: tuple[str, ...], engine: str, master: str | None) -> dict[str, str]:
    """The ``--conf KEY=VALUE`` settings as a dict (``--master``/``--conf`` only with
    ``--engine spark``)."""
    if engine != "spark" and (confs or master):
        raise click.UsageError("--master and --conf set up Spark: use them with --engine spark")
    out = {}
    for pair in confs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r}: use KEY=VALUE", param_hint="--conf")
        out[key.strip()] = value.strip()
    return out


def dataset_root(db: str) -> Path:
    """The folder of a ``parquet:DIR`` store (a DuckDB file is a usage error)."""
    if not db.startswith("parquet:"):
        raise click.UsageError(f"{db} is a DuckDB file, whose summaries its writer keeps up "
                               "to date as rows arrive; summarize is for a Parquet dataset "
                               "(--db parquet:DIR)")
    return Path(db[len("parquet:"):])


def summary_pass(root: Path, engine: str, master: str | None, conf: dict[str, str],
          verbose: bool = False) -> Any:
    """One summarising pass; a Spark that cannot start, or a dataset it cannot summarise
    as it is, is a one-line error (the trace too with ``verbose``)."""
    from goodlens.storage import bulk
    from goodlens.storage.spark import SparkUnavailable
    try:
        with dataset_errors(verbose):
            return bulk.summarize(root, engine, master, conf, quiet=not verbose)
    except SparkUnavailable as exc:
        raise click.ClickException(str(exc)) from None


def _pass_text(stats: Any, root: Path, master: str | None) -> str:
    s = stats
    where = f"Spark on {master or 'local[*]'}" if s.engine == "spark" else "DuckDB"
    return (f"{where}: {s.runs_summarised:,} of {s.runs:,} run(s) had new segments; read "
            f"{s.segments_read:,} of {s.segments:,} segments ({s.rows_read:,} rows); "
            f"summarised {s.steps_summarised:,} steps; wrote {s.checkpoints_written:,} "
            f"checkpoint(s) under {root / 'summaries'} in {s.seconds:.1f} s")


@click.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="The Parquet dataset (parquet:DIR).")
@engine_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def summarize(db: str, engine: str, master: str | None, confs: tuple[str, ...],
              verbose: bool, as_json: bool) -> None:
    """Summarise a Parquet dataset's new step rows into the summary checkpoints every
    goodlens reader opens (`goodlens report --db parquet:DIR` then reads them instead of
    the raw rows).

    Incremental: segments a checkpoint already covers are not read again, except those
    holding rows of the same steps as new ones. Rows stored twice (two collectors, a
    compaction in progress) count once. Run it again any time; it writes nothing when
    nothing is new.

    It writes nothing, and exits 1 with one line saying what to do, when a segment cannot
    be read, when the engine reads rows it cannot attribute to a run, or when a step would
    be summarised again from fewer ranks than its checkpoint counted (docs/scaling.md).
    """
    root = dataset_root(db)
    stats = summary_pass(root, engine, master, engine_conf(confs, engine, master), verbose)
    if as_json:
        echo_json(stats.as_dict())
    else:
        click.echo(_pass_text(stats, root, master))


@click.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="Store: parquet:DIR (summarised first, by --engine) or a DuckDB file.")
@engine_options
@click.option("--out", type=click.Path(dir_okay=False),
              help="Parquet file to write (default for parquet:DIR: DIR/fleet/fleet.parquet; "
                   "required for a DuckDB file).")
@click.option("--at", "at", help="The instant runs still in progress are accounted up to: "
                                 "epoch s or ISO time (default: now).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fleet(db: str, engine: str, master: str | None, confs: tuple[str, ...], verbose: bool,
          out: str | None, at: str | None, as_json: bool) -> None:
    """Write the fleet table: one row per run and attempt with goodput, every bucket and
    the parts of startup and restart, GPU-hours, ranks and state, as plain Parquet that
    DuckDB, Spark and Trino read without goodlens (docs/spark.md: its columns and an
    example query, goodput by week and job name).

    The numbers are the report's: each run is accounted from its step summaries and events
    (a run in progress up to now, or --at). With parquet:DIR the summaries are brought up to
    date first, by --engine.
    """
    from goodlens import __version__
    from goodlens.analysis.accounting import ACCOUNTING_KINDS
    from goodlens.analysis.fleet import FLEET_COLUMNS, fleet_rows
    from goodlens.storage import fleetio
    conf = engine_conf(confs, engine, master)
    try:
        now = None if at is None else parse_instant(at)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--at") from None
    path = Path(out) if out else fleetio.default_path(db)
    if path is None:
        raise click.UsageError("give --out PATH for a DuckDB file's fleet table")
    stats = None
    if db.startswith("parquet:"):
        stats = summary_pass(dataset_root(db), engine, master, conf, verbose)
    elif engine != "duckdb":
        raise click.UsageError("a DuckDB file's summaries are its own: drop --engine spark")
    now = time.time() if at is None else now
    t0 = time.perf_counter()
    store = open_store(db)
    try:
        inputs = fleetio.read_inputs(store, ACCOUNTING_KINDS)
    finally:
        store.close()
    frame = fleet_rows(inputs.runs, inputs.attempts, inputs.steps, inputs.events, now=now,
                       progress=_bar)
    meta = {"goodlens.version": __version__, "goodlens.as_of": repr(now),
            "goodlens.summaries_engine": engine}
    fleetio.write(path, fleetio.as_table(frame, [(n, k) for n, k, _ in FLEET_COLUMNS], meta))
    doc = {"path": str(path), "runs": int(frame.run_id.nunique()), "rows": len(frame),
           "as_of": now, "accounting_seconds": round(time.perf_counter() - t0, 3),
           "summarize": stats.as_dict() if stats is not None else None}
    if as_json:
        echo_json(doc)
        return
    if stats is not None:
        click.echo(_pass_text(stats, dataset_root(db), master))
    click.echo(f"wrote {path}: {doc['rows']:,} rows, one per attempt of {doc['runs']:,} "
               f"run(s), accounted in {doc['accounting_seconds']:.1f} s")


def _bar(run_ids: list[str]) -> Any:
    """The runs being accounted, behind a progress bar on a terminal when there are many."""
    import sys
    with click.progressbar(run_ids, label="accounting runs", file=sys.stderr,
                           hidden=len(run_ids) <= 50 or not sys.stderr.isatty()) as bar:
        yield from bar
