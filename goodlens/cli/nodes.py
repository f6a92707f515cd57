"""``goodlens nodes``: one row per host across every run, and which hosts to drain.

Wiring only: the reads are :mod:`goodlens.storage.nodeio`'s (DuckDB, or Spark over a
Parquet dataset's segments), the counting, the test and the verdict
:mod:`goodlens.analysis.nodes`'s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from goodlens.cli.batch import dataset_root, engine_conf, engine_options, summary_pass
from goodlens.cli.common import StoreSpec, dataset_errors, echo_json, open_store, table
from goodlens.model.units import parse_instant

_SHOWN = (("host", "host"), ("verdict", "verdict"), ("runs", "runs"), ("hours", "hours"),
          ("incidents", "incidents"), ("failures", "failures"), ("hangs", "hangs"),
          ("stragglers", "stragglers"), ("evictions", "evictions"), ("restarts", "restarts"),
          ("exclusions", "exclusions"), ("rate_ratio", "x fleet"), ("q_value", "BH q"))


@click.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="Store: a DuckDB file or a Parquet dataset (parquet:DIR).")
@engine_options
@click.option("--since", help="Start of the time range: epoch s, ISO time, or -DURATION "
                              "before now (-7d). Default: everything stored.")
@click.option("--until", help="End of the time range (as --since). Default: now.")
@click.option("--q", "q", type=float, default=0.05, show_default=True,
              help="False discovery rate of the drain verdicts (Benjamini-Hochberg).")
@click.option("--all", "show_all", is_flag=True,
              help="List every host (default: those to drain, then the 20 with the "
                   "smallest p-values).")
@click.option("--drain-list", is_flag=True,
              help="Print only the names of the hosts to drain, one a line (for a "
                   "scheduler's drain or cordon command; goodlens runs nothing).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def nodes(db: str, engine: str, master: str | None, confs: tuple[str, ...], verbose: bool,
          since: str | None, until: str | None, q: float, show_all: bool, drain_list: bool,
          as_json: bool) -> None:
    """One row per host across every run in a time range: hours observed, failures by
    cause, hangs, straggler findings, evictions, restarts it was part of and exclusions,
    with its incident rate against the fleet's and a drain verdict.

    An incident is an attempt in which the host was named by a failure (its own cause, not
    a survivor's collective error), a hang, a straggler finding or an eviction; the host of
    a rank is where the rank ran in that attempt. Test: given the fleet's K incidents over
    H host-hours, a host with h hours has X ~ Binomial(K, h/H) incidents if it is like the
    others; its p-value P(X >= its count) is adjusted across hosts by Benjamini-Hochberg,
    and `drain` means an adjusted value <= --q (docs/nodes.md).

    With --engine spark (a Parquet dataset) Spark summarises the new rows and reads where
    each rank ran from the segments; DuckDB otherwise. `--drain-list | xargs -n1 scontrol
    ...` or `kubectl cordon`: the list is printed, never acted on.
    """
    from goodlens.analysis.nodes import NodeInputs, node_table
    conf = engine_conf(confs, engine, master)
    now = time.time()
    lo, hi = _instant(since, now, "--since"), _instant(until, now, "--until")
    if lo is not None and hi is not None and hi < lo:
        raise click.BadParameter("--until is before --since", param_hint="--until")
    if not 0.0 < q < 1.0:
        raise click.BadParameter("a false discovery rate between 0 and 1, e.g. 0.05",
                                 param_hint="--q")
    if engine == "spark" and not db.startswith("parquet:"):
        raise click.UsageError("--engine spark reads a Parquet dataset (parquet:DIR); a "
                               "DuckDB file is read by DuckDB: drop --engine spark")
    t0 = time.perf_counter()
    frames = _read(db, engine, master, conf, verbose)
    t = node_table(NodeInputs(**frames), since=lo, until=hi, q=q)
    if drain_list:
        for host in t.drain():
            click.echo(host)
        return
    if as_json:
        echo_json({**t.as_dict(), "engine": engine,
                   "seconds": round(time.perf_counter() - t0, 3)})
        return
    click.echo(_text(t, show_all))


def _instant(text: str | None, now: float, hint: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_instant(text, None, now)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _read(db: str, engine: str, master: str | None, conf: dict[str, str],
          verbose: bool) -> dict[str, Any]:
    """The node inputs of every run, read by ``engine`` (a Parquet dataset's summaries
    brought up to date first, by the same engine, as ``goodlens fleet`` does)."""
    from goodlens.storage import nodeio
    if engine != "spark":
        if db.startswith("parquet:"):
            summary_pass(dataset_root(db), engine, master, conf, verbose)
        store = open_store(db)
        try:
            return nodeio.read_duckdb(store)
        finally:
            store.close()
    from goodlens.storage import bulk, spark
    root = dataset_root(db)
    try:
        with dataset_errors(verbose), spark.spark_session(master, conf) as session:
            bulk.summarize_dataset(root, spark.engine(session, Path(root)), engine="spark")
            read = nodeio.read_spark(session, Path(root))
    except spark.SparkUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    store = open_store(db)
    try:
        attempts = store.cursor().sql(nodeio.ATTEMPTS_SQL).df()
    finally:
        store.close()
    return {"attempts": attempts, **read}


def _text(t: Any, show_all: bool) -> str:
    rate = t.rate_per_hour
    head = (f"{t.hosts} host(s), {t.hours:,.1f} host-hours, {t.incidents} incident(s)"
            + (f": the fleet's rate {rate:.3g} per host-hour" if rate is not None else ""))
    rows = t.rows if show_all else t.rows[(t.rows.verdict == "drain")
                                          | (t.rows.index < 20 + len(t.drain()))]
    cells = []
    for r in rows.to_dict("records"):
        cell = {k: r[k] for k, _ in _SHOWN}
        cell["hours"] = f"{r['hours']:.1f}"
        cell["rate_ratio"] = "-" if r["rate_ratio"] != r["rate_ratio"] else \
            f"{r['rate_ratio']:.1f}"
        cell["q_value"] = "-" if r["q_value"] != r["q_value"] else f"{r['q_value']:.2g}"
        cells.append(cell)
    out = [head, f"test: exact binomial per host, Benjamini-Hochberg at q={t.q:g}", "",
           table(cells, list(_SHOWN)) if cells else "no host observed"]
    drain = t.drain()
    out.append("")
    out.append(f"drain ({len(drain)}): " + ", ".join(drain) if drain else
               "drain: none (no host's rate stands out at this false discovery rate)")
    for r in t.rows[t.rows.verdict == "drain"].itertuples():
        causes = ", ".join(f"{c} {n}" for c, n in json.loads(r.failure_causes).items())
        out.append(f"  {r.host}: {r.evidence}" + (f"; failures by cause: {causes}"
                                                  if causes else ""))
    if not show_all and len(t.rows) > len(rows):
        out.append(f"({len(t.rows) - len(rows)} more host(s): --all lists them)")
    return "\n".join(out)
