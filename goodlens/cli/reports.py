"""``goodlens runs``, ``goodlens report`` and ``goodlens detect``: what a store holds, where
each run's wall-clock went, and which ranks, hosts or switches are stragglers. The text forms
are rendered here; ``--json`` prints the library's numbers as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

from goodlens.cli.common import (
    CollectorUrl,
    StoreSpec,
    dataset_errors,
    detector_options,
    echo_json,
    get_json,
    open_store,
    read_token,
    straggler_config,
    table,
    token_options,
    verbose_option,
)
from goodlens.model.jsonable import plain, records
from goodlens.model.units import format_duration, format_instant
from goodlens.storage.reports import SORT_KEYS

_RUN_COLUMNS = [("run_id", "run"), ("state", "state"), ("goodput_pct", "goodput"),
                ("world_size", "ranks"), ("attempts", "attempts"), ("steps", "steps"),
                ("last_step", "last step"), ("duration", "duration"),
                ("started", "started (UTC)")]
_SORTS = tuple(SORT_KEYS)


@click.command()
@click.option("--db", "--store", "db", type=StoreSpec(),
              help="Store file (no collector may hold it).")
@click.option("--url", help="A running collector to ask instead, e.g. http://127.0.0.1:8470.")
@token_options("token for --url")
@click.option("--sort", type=click.Choice(_SORTS), default="start", show_default=True,
              help="Order of the list (goodput and duration: of the run's stored report).")
@click.option("--asc", is_flag=True, help="Ascending order (default: descending).")
@click.option("--state", help="Only runs in this state (running, completed, failed, ...).")
@click.option("--filter", "text", help="Only runs whose id or name contains this text "
                                       "(any case).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="Runs per page.")
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True,
              help="Runs to skip (the next page starts at --offset + --limit).")
@verbose_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def runs(db: str | None, url: str | None, token: str | None, token_file: str | None,
         sort: str, asc: bool, state: str | None, text: str | None, limit: int, offset: int,
         as_json: bool) -> None:
    """List the runs in a store, a page at a time: state, goodput, ranks, attempts, steps,
    duration. Sorted and filtered where the runs are (the collector, or the file), so a
    store of 10,000 runs lists as fast as one of ten."""
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH or --url URL")
    token = read_token(token, token_file)
    page = {"limit": limit, "offset": offset, "sort": sort, "order": "asc" if asc else "desc",
            "state": state, "q": text}
    if url:
        from urllib.parse import urlencode
        query = urlencode({k: v for k, v in page.items() if v is not None})
        answer = get_json(url.rstrip("/") + "/v1/runs?" + query, token)
        rows, total = answer["runs"], answer.get("total", len(answer["runs"]))
    else:
        with dataset_errors():
            rows, total = _stored_runs(db, page)
    for r in rows:
        start, last = r.get("start"), r.get("last_time")
        r["duration_s"] = (r.get("wall_clock_s") or ((last - start) if start is not None
                                                       and last is not None else None))
    more = offset + len(rows) < total
    if as_json:
        echo_json({"runs": [{k: plain(v) for k, v in r.items()} for r in rows],
                   "total": total, "offset": offset,
                   "next_offset": offset + len(rows) if more else None})
        return
    if not rows:
        click.echo("no runs match: see `goodlens runs --help` for the filters" if total or
                   state or text or offset else
                   "no runs yet: point an exporter at the collector, or import a trace with "
                   "`goodlens import TRACE --db PATH`")
        return
    import datetime as dt
    for r in rows:
        r["duration"] = format_duration(r["duration_s"]) if r["duration_s"] is not None else None
        r["started"] = (dt.datetime.fromtimestamp(r["start"], dt.UTC)
                        .strftime("%Y-%m-%d %H:%M:%S") if r.get("start") else None)
        r["goodput_pct"] = f"{100 * r['goodput']:.1f}%" if r.get("goodput") is not None \
            else None
    click.echo(table(rows, _RUN_COLUMNS))
    if offset or more:
        click.echo(f"runs {offset + 1}-{offset + len(rows)} of {total}" +
                   (f"; next page: --offset {offset + len(rows)}" if more else ""))


def _stored_runs(db: str, page: dict) -> tuple[list[dict], int]:
    """A page of a store file's runs. A run no collector has accounted yet (an imported
    trace) gets its goodput computed here: for the rows shown, or, sorting by goodput, for
    every run that matches (with a progress bar), since the order depends on all of them
    (:func:`goodlens.analysis.report.fill_goodput`)."""
    from goodlens.analysis.report import fill_goodput, run_goodput
    store = open_store(db)
    try:
        kw = {"sort": page["sort"], "descending": page["order"] == "desc",
              "state": page["state"], "text": page["q"]}
        df, total = store.runs_page(limit=page["limit"], offset=page["offset"], **kw)

        def account(r: dict) -> dict:
            goodput, wall = run_goodput(store, r["run_id"])
            return {"goodput": goodput, "wall_clock_s": wall}
        def unknown_after() -> bool:  # the store sorts runs without a goodput last
            end = page["offset"] + len(df)
            return end < total and records(store.runs_page(
                limit=1, offset=total - 1, **kw)[0])[0].get("goodput") is None
        rows = fill_goodput(records(df), account,
                            every=lambda: records(store.runs_page(**kw)[0]),
                            unknown_after=unknown_after, by_goodput=page["sort"] == "goodput",
                            descending=kw["descending"], offset=page["offset"],
                            limit=page["limit"], progress=_accounting_bar)
    finally:
        store.close()
    return rows, total


def _accounting_bar(todo: list[dict]) -> Iterator[dict]:
    """The runs being accounted, behind a progress bar when there are many."""
    with click.progressbar(todo, label="accounting runs no collector has accounted",
                           hidden=len(todo) <= 20) as bar:
        yield from bar


_BUCKET_NOTES = {"productive": "forward progress",
                 "straggler_wait": "all ranks waiting on the slowest",
                 "checkpoint_stall": "training blocked by saves",
                 "recompute": "steps redone after a rollback",
                 "startup": "first start to first step", "restart": "failure to next step",
                 "other": "gaps, eval, input stalls, custom intervals"}


def _iso(t: float | None) -> str:
    """An instant as ISO 8601 in UTC (``2026-01-01T00:10:00Z``); ``?`` when unknown."""
    import datetime as dt
    import math
    if t is None or not math.isfinite(t):
        return "?"
    text = dt.datetime.fromtimestamp(t, dt.UTC).isoformat(
        timespec="seconds" if float(t).is_integer() else "milliseconds")
    return text.replace("+00:00", "Z")


def _window_text(window: dict[str, Any]) -> str:
    """``--since``/``--until`` as read: ``2026-...Z to 2026-...Z`` (an open side: the run's
    start or end)."""
    lo, hi = window.get("since"), window.get("until")
    start = _iso(lo) if lo is not None else "the run's start"
    end = _iso(hi) if hi is not None else "the run's end"
    return f"{start} to {end}"


def report_text(rep: dict[str, Any]) -> str:
    """The human form of a report (what `goodlens report` prints)."""
    wall = rep["wall_clock_s"]
    def pct(v):
        return (f"{100 * v / wall:5.1f}%" if wall and v is not None else "    -")
    state = "in progress" if rep["in_progress"] else "ended"
    gpu = rep["gpu_time_goodput"]
    when = (f" as of {format_instant(rep['as_of'])}" if rep.get("as_of") is not None else "")
    lines = [f"run {rep['run']} ({state}{when}): wall-clock {format_duration(wall)}"
             + (f" in the window {_window_text(rep['window'])}" if rep.get("window") else ""),
             f"goodput {100 * rep['goodput']:.1f}% of wall-clock"
             + (f", {100 * gpu:.1f}% of allocated GPU-time" if gpu is not None else ""), ""]
    rows = []
    for b, v in rep["buckets"].items():
        rows.append({"b": b, "t": "not measured" if v is None else format_duration(v),
                     "p": pct(v), "n": _BUCKET_NOTES[b]})
        if b in ("startup", "restart", "other"):
            rows += [{"b": f"  {k}", "t": format_duration(x), "p": pct(x), "n": ""}
                     for k, x in (rep.get(f"{b}_parts") or {}).items() if x]
    lines.append(table(rows, [("b", "bucket"), ("t", "time"), ("p", "share"), ("n", "")]))
    steps = rep.get("steps") or {}
    if steps:
        lines.append(f"\nsteps: {steps.get('kept', 0)} kept, {steps.get('recomputed', 0)} "
                     f"recomputed, {steps.get('incomplete', 0)} with ranks missing")
    out = {k: v for k, v in (rep.get("excluded") or {}).items()}
    if out:
        lines.append("excluded from the wall-clock: " + ", ".join(
            f"{k} {format_duration(v)}" for k, v in out.items()))
    partial = rep.get("partial_steps") or {}
    if partial.get("estimated"):
        lines.append(f"{partial['estimated']} failure(s) without a `failure` event: the step "
                     "in flight at each is estimated (one median step of recompute)")
    if rep["buckets"]["straggler_wait"] is None:
        lines.append("straggler wait not measured: the exporter reported no compute/wait split "
                     "(use exp.phase('collective') or the PyTorch integration)")
    quiet = rep.get("silence") or {}
    if quiet.get("silent"):
        lines.append(f"\nno data for {format_duration(quiet['silent_s'])} (past the "
                     f"{format_duration(quiet['timeout_s'])} its step rhythm allows): hung, or "
                     "gone without an end event; its wall-clock keeps growing as other: "
                     "since_last_step. If the job is gone, end the run with "
                     f"`goodlens end-run --run {rep['run']} --db STORE` (or --url).")
    if rep.get("fault_tolerance"):
        from goodlens.cli.ftreport import ft_text
        lines.append(ft_text(rep["fault_tolerance"]))
    atts = rep.get("attempts") or []
    if len(atts) > 1:
        lines.append("")
        lines.append(table([{"a": a["attempt"], "w": format_duration(a["wall_clock_s"]),
                             "g": f"{100 * a['goodput']:.1f}%",
                             "s": format_duration(a["buckets"].get("startup", 0.0)),
                             "r": format_duration(a["buckets"]["restart"]),
                             "c": format_duration(a["buckets"]["recompute"])} for a in atts],
                           [("a", "attempt"), ("w", "wall-clock"), ("g", "goodput"),
                            ("s", "startup"), ("r", "restart"), ("c", "recompute")]))
    if rep.get("restart_loop"):
        from goodlens.analysis.loops import loop_text
        lines += ["", loop_text(rep["restart_loop"])]
    return "\n".join(lines)


@click.command()
@click.option("--db", "--store", "db", type=StoreSpec(),
              help="Store file (no collector may hold it).")
@click.option("--url", type=CollectorUrl(),
              help="A running collector to ask instead, e.g. http://127.0.0.1:8470.")
@token_options("token for --url")
@click.option("--run", "run_id", help="Run id (default: the most recently started run).")
@click.option("--since", help="Window start: epoch s, ISO time, +2h (into the run), -30m (before "
                              "its end).")
@click.option("--until", help="Window end, same forms as --since.")
@click.option("--exclude", "excludes", multiple=True, metavar="NAME[,NAME]",
              help="Take these out of the wall-clock entirely: a custom interval's label "
                   "(maintenance, debug) or a named part (queue: the scheduler's, not the "
                   "job's). Repeatable or comma-separated.")
@click.option("--as-of", "as_of", help="Report the run as it was known at this instant (same "
                                      "forms as --since): only the steps and events of "
                                      "until then, so no later rollback re-files time.")
@verbose_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def report(db: str | None, url: str | None, token: str | None, token_file: str | None,
           run_id: str | None, since: str | None, until: str | None,
           excludes: tuple[str, ...], as_of: str | None, as_json: bool) -> None:
    """Where the wall-clock went: goodput and every bucket, per run, attempt and window.

    Buckets: productive, straggler_wait, checkpoint_stall, recompute, startup (the first
    attempt's start to its first step: init, restore, warmup), restart (a failure to the next
    step: detection, queue, init, restore, warmup, unattributed) and other. They sum to the
    wall-clock (less what --exclude takes out).
    """
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH or --url URL")
    token = read_token(token, token_file)
    exclude = [x.strip() for e in excludes for x in e.split(",") if x.strip()]
    if url:
        import urllib.parse
        q = {k: v for k, v in (("run", run_id), ("since", since), ("until", until),
                               ("exclude", ",".join(exclude)), ("as_of", as_of)) if v}
        rep = get_json(url.rstrip("/") + "/v1/report?" + urllib.parse.urlencode(q), token)
    else:
        from goodlens.analysis.report import report_dict
        store = open_store(db)
        try:
            try:
                with dataset_errors():
                    rep = report_dict(store, run_id, since, until, exclude=exclude,
                                      as_of=as_of)
            except KeyError as exc:
                raise click.ClickException(str(exc.args[0])) from None
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--since/--until/--as-of") \
                    from None
            for text in store.warnings:  # steps that keep figures their rows no longer give
                click.echo(f"warning: {text}", err=True)
        finally:
            store.close()
    window = rep.get("window")
    if window and not window["overlaps_run"]:
        click.echo(f"warning: the window {_window_text(window)} holds none of run "
                   f"{rep['run']} ({_iso(window['run_start'])} to {_iso(window['run_end'])}), "
                   "so every figure is 0; pick --since/--until inside the run (+10m: ten "
                   "minutes into it, -30m: its last half hour)", err=True)
    if as_json:
        echo_json(rep)
    else:
        click.echo(report_text(rep))


@click.command()
@click.option("--db", "--store", "db", type=StoreSpec(exists=True),
              help="Store file (no collector may hold it).")
@click.option("--url", type=CollectorUrl(),
              help="A running collector to read the run from instead, e.g. 127.0.0.1:8470.")
@token_options("token for --url")
@click.option("--run", "run_id", required=True, help="Run id.")
@detector_options
@verbose_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def detect(db: str | None, url: str | None, token: str | None, token_file: str | None,
           run_id: str, threshold: float, min_slowdown: float, evict_at: float,
           as_json: bool) -> None:
    """Find persistent stragglers in a stored run: ranks, hosts or switches slower than their
    siblings (a rank than the other ranks of its host, a host than the other hosts behind its
    switch, a switch than the rest of the job), scored on each rank's time to reach the
    collective; from which step, by how much (slower to reach the collective than their
    siblings, and how much longer that makes the job's steps: "job slowdown"), what they
    cost, whether to evict them, and whether they are still open at the end of the run or
    resolved. With --url, the run is
    read from a running collector (which holds its store file). --threshold,
    --min-slowdown and --evict-at tune the detector (`goodlens serve` takes the same).
    """
    from functools import partial

    from goodlens.analysis.findings import (
        FINDING_COLUMNS,
        detect_run,
        finding_cells,
        finding_dicts,
        joint_job_slowdown,
    )
    from goodlens.cli.remote import one_source, read_run_at
    one_source(db, url)
    token = read_token(token, token_file)
    config = straggler_config(threshold, min_slowdown, evict_at)
    try:
        with dataset_errors():
            found = read_run_at(db, url, token, run_id, partial(detect_run, config=config))
    except ValueError as exc:  # rank ids too sparse to lay out: say so, in one line
        raise click.ClickException(f"{exc}; detection needs rank ids 0..N-1") from None
    dicts = finding_dicts(found)
    joint = joint_job_slowdown(dicts)
    if as_json:
        echo_json({"run": run_id, "joint_job_slowdown": joint,
                   "findings": [{k: plain(v) for k, v in f.items()} for f in dicts]})
        return
    if not found:
        click.echo(f"run {run_id}: no persistent straggler found")
        return
    # the dashboard's ranks page lays findings out with the same columns and text
    click.echo(table([finding_cells(f) for f in dicts], list(FINDING_COLUMNS)))
    if joint is not None:
        click.echo(f"open findings together: job slowdown {100 * joint:.1f}% (each one's "
                   "part of it: \"part of joint\")")
