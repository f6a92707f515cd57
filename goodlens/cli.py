"""The ``goodlens`` command: wires the library together and holds no logic of its own.

Every command that reports numbers takes ``--json`` (seconds for every duration); durations
on the command line accept ``90s``, ``5m``, ``24h``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import click

from goodlens import __version__
from goodlens.units import format_duration, parse_duration

DEFAULT_PORT = 8470


class Duration(click.ParamType):
    """A click parameter accepting ``90s``, ``5m``, ``24h``; yields seconds."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class ByteSize(click.ParamType):
    """A size such as ``64MiB``, ``1GB`` or a number of bytes."""

    name = "size"
    _UNITS: ClassVar[dict[str, int]] = {
        "": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2,
        "gb": 1000**3, "gib": 1024**3}

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(num):].strip()
        try:
            return int(float(num) * self._UNITS[unit])
        except (ValueError, KeyError):
            self.fail(f"not a size: {value!r} (use e.g. 64MiB, 1GB or bytes)", param, ctx)


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=_json_default, allow_nan=False))


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _clean(value: Any) -> Any:
    """NaN/NA to None, numpy scalars to Python."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if type(value).__name__ == "NAType":
        return None
    return value


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain-text table of ``rows`` with ``(key, header)`` columns."""
    cells = [[header for _, header in columns]]
    for row in rows:
        cells.append(["-" if row.get(k) is None else str(row.get(k)) for k, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _read_run(db: str, run_id: str, read: Any) -> Any:
    """``read(store, run_id)`` over a store opened read-only, after checking the run is
    there (a clear error naming the store when not); the store is closed afterwards."""
    store = _open_store(db)
    try:
        if store.run(run_id) is None:
            raise click.ClickException(f"no run {run_id!r} in {db}; see `goodlens runs`")
        return read(store, run_id)
    finally:
        store.close()


class StoreSpec(click.ParamType):
    """``--db``: a DuckDB file, or ``parquet:DIR`` for a Parquet dataset."""

    name = "PATH|parquet:DIR"

    def __init__(self, exists: bool = False) -> None:
        self.exists = exists

    def get_metavar(self, *args: Any, **kwargs: Any) -> str:
        """Shown in --help as is (click would upper-case the name)."""
        return self.name

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if text.startswith("parquet:"):
            folder = Path(text[len("parquet:"):])
            if self.exists and not (folder / "_goodlens.json").exists():
                self.fail(f"no goodlens Parquet dataset in {folder}", param, ctx)
            return text
        path = Path(text[len("duckdb:"):] if text.startswith("duckdb:") else text)
        if path.is_dir():
            self.fail(f"{path} is a directory; for a Parquet dataset pass parquet:{path}",
                      param, ctx)
        if self.exists and not path.exists():
            self.fail(f"{path} does not exist", param, ctx)
        return str(path)


def _open_store(db: str, read_only: bool = True) -> Any:
    from collector.store import SchemaMismatch
    from collector.store_parquet import open_store
    try:
        return open_store(db, read_only=read_only)
    except (FileNotFoundError, RuntimeError, SchemaMismatch) as exc:
        raise click.ClickException(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="goodlens")
def main() -> None:
    """goodlens: where the wall-clock of a large training run went, and what to do about it.

    Start a collector with `goodlens serve`, point exporters at it, and ask
    `goodlens runs` what it holds.
    """


@main.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(),
              help="DuckDB file the collector owns (created if missing), or parquet:DIR: a "
                   "Parquet dataset that several collectors can write at once.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback requires --token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int,
              help="TCP port (0 picks a free one).")
@click.option("--token", envvar="GOODLENS_TOKEN", default=None,
              help="Bearer token exporters must send (env GOODLENS_TOKEN).")
@click.option("--max-body", type=ByteSize(), default="64MiB", show_default=True,
              help="Largest accepted push.")
@click.option("--max-queue-rows", type=int, default=4_000_000, show_default=True,
              help="Rows the write queue holds before pushes get 503 (exporters back off).")
@click.option("--summarize-every", type=Duration(), default="1s", show_default=True,
              help="How often per-step summaries catch up with new rows (e.g. 500ms, 2s).")
@click.option("--memory-limit", default="2GB", show_default=True,
              help="DuckDB memory limit for the store (its cache otherwise grows with the data).")
@click.option("--detect/--no-detect", default=True, show_default=True,
              help="Run the straggler detector over live runs.")
@click.option("--webhook", help="URL that receives each straggler finding once (JSON POST), "
                                "e.g. a launcher that evicts.")
@click.option("--hang-floor", type=Duration(), default="60s", show_default=True,
              help="Shortest hang timeout; the timeout adapts to 3x the longest step interval.")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True,
              help="Serve the dashboard at / (with --token, open it once as /?token=...).")
@click.option("--load", "loads", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Trace folder to import before serving (repeatable; importing twice adds "
                   "nothing).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(db: str, host: str, port: int, token: str | None, max_body: int,
          max_queue_rows: int, summarize_every: float, memory_limit: str, detect: bool,
          webhook: str | None, hang_floor: float, dashboard: bool, loads: tuple[str, ...],
          log_level: str) -> None:
    """Run the collector: ingest on /v1/ingest, Prometheus on /metrics, health on /healthz.

    One process owns the DuckDB file (DuckDB lets no other process open it meanwhile);
    stop it with Ctrl-C or SIGTERM, which writes everything queued first.
    """
    from collector.server import ServerConfig
    from collector.server import serve as run_server

    try:
        config = ServerConfig(db=db, host=host, port=port, token=token,
                              max_body_bytes=max_body, max_queue_rows=max_queue_rows,
                              memory_limit=memory_limit, summarize_interval_s=summarize_every,
                              detect=detect, webhook=webhook, hang_floor_s=hang_floor,
                              dashboard=dashboard)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if not db.startswith("parquet:"):
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    if loads:
        store = _open_store(db, read_only=False)
        try:
            for path in loads:
                _import(store, path, quiet=False)
        finally:
            store.close()

    def ready(bound: int) -> None:
        click.echo(f"goodlens collector on http://{host}:{bound}  (db: {db})", err=True)
        click.echo(f"  push:    http://{host}:{bound}/v1/ingest", err=True)
        click.echo(f"  metrics: http://{host}:{bound}/metrics", err=True)
        if dashboard:
            click.echo(f"  dashboard: http://{host}:{bound}/", err=True)

    try:
        run_server(config, ready=ready, log_level=log_level)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None


_RUN_COLUMNS = [("run_id", "run"), ("state", "state"), ("world_size", "ranks"),
                ("attempts", "attempts"), ("steps", "steps"), ("last_step", "last step"),
                ("duration", "duration"), ("started", "started (UTC)")]


@main.command()
@click.option("--db", "--store", "db", type=StoreSpec(),
              help="Store file (no collector may hold it).")
@click.option("--url", help="A running collector to ask instead, e.g. http://127.0.0.1:8470.")
@click.option("--token", envvar="GOODLENS_TOKEN", default=None, help="Token for --url.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def runs(db: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """List the runs in a store: state, ranks, attempts, steps, duration."""
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH or --url URL")
    if url:
        rows = _get_json(url.rstrip("/") + "/v1/runs", token)["runs"]
    else:
        from collector.server import records
        store = _open_store(db)
        try:
            rows = records(store.runs())
        finally:
            store.close()
    for r in rows:
        start, last = r.get("start"), r.get("last_time")
        r["duration_s"] = (last - start) if start is not None and last is not None else None
    if as_json:
        _echo_json({"runs": [{k: _clean(v) for k, v in r.items()} for r in rows]})
        return
    if not rows:
        click.echo("no runs yet: point an exporter at the collector, or import a trace with "
                   "`goodlens import TRACE --db PATH`")
        return
    import datetime as dt
    for r in rows:
        r["duration"] = format_duration(r["duration_s"]) if r["duration_s"] is not None else None
        r["started"] = (dt.datetime.fromtimestamp(r["start"], dt.UTC)
                        .strftime("%Y-%m-%d %H:%M:%S") if r.get("start") else None)
    click.echo(table(rows, _RUN_COLUMNS))


def _get_json(url: str, token: str | None, body: Any = None) -> Any:
    """GET ``url`` (POST ``body`` as JSON when given) from a collector; the JSON answer."""
    import urllib.error
    import urllib.request
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{url} answered {exc.code}: {exc.read()[:200]!r}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}; is `goodlens serve` running?") \
            from None


def _import(store: Any, path: str, quiet: bool) -> dict[str, int]:
    from collector.replay import import_trace
    from goodlens.trace import TraceError, read_trace
    try:
        trace = read_trace(path)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    total = sum(t.num_rows for k, t in trace.tables.items() if k in ("steps", "events"))
    with click.progressbar(length=total, label=f"importing {path}", file=sys.stderr,
                           hidden=quiet or not sys.stderr.isatty()) as bar:
        return import_trace(store, path, progress=bar.update)


def _instant(text: str | None, start: float, end: float, name: str) -> float | None:
    from goodlens.units import parse_instant
    if text is None:
        return None
    try:
        return parse_instant(text, start, end)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from None


_BUCKET_NOTES = {"productive": "forward progress",
                 "straggler_wait": "all ranks waiting on the slowest",
                 "checkpoint_stall": "training blocked by saves",
                 "recompute": "steps redone after a rollback", "restart": "failure to next step",
                 "other": "gaps, eval, custom intervals"}


def report_text(rep: dict[str, Any]) -> str:
    """The human form of a report (what `goodlens report` prints)."""
    wall = rep["wall_clock_s"]
    def pct(v):
        return (f"{100 * v / wall:5.1f}%" if wall and v is not None else "    -")
    state = "in progress" if rep["in_progress"] else "ended"
    gpu = rep["gpu_time_goodput"]
    lines = [f"run {rep['run']} ({state}): wall-clock {format_duration(wall)}",
             f"goodput {100 * rep['goodput']:.1f}% of wall-clock"
             + (f", {100 * gpu:.1f}% of allocated GPU-time" if gpu is not None else ""), ""]
    rows = []
    for b, v in rep["buckets"].items():
        rows.append({"b": b, "t": "not measured" if v is None else format_duration(v),
                     "p": pct(v), "n": _BUCKET_NOTES[b]})
        if b == "restart":
            rows += [{"b": f"  {k}", "t": format_duration(x), "p": pct(x), "n": ""}
                     for k, x in rep["restart_parts"].items() if x]
        if b == "other":
            rows += [{"b": f"  {k}", "t": format_duration(x), "p": pct(x), "n": ""}
                     for k, x in rep["other_parts"].items() if x]
    lines.append(table(rows, [("b", "bucket"), ("t", "time"), ("p", "share"), ("n", "")]))
    steps = rep.get("steps") or {}
    if steps:
        lines.append(f"\nsteps: {steps.get('kept', 0)} kept, {steps.get('recomputed', 0)} "
                     f"recomputed, {steps.get('incomplete', 0)} with ranks missing")
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
    atts = rep.get("attempts") or []
    if len(atts) > 1:
        lines.append("")
        lines.append(table([{"a": a["attempt"], "w": format_duration(a["wall_clock_s"]),
                             "g": f"{100 * a['goodput']:.1f}%",
                             "r": format_duration(a["buckets"]["restart"]),
                             "c": format_duration(a["buckets"]["recompute"])} for a in atts],
                           [("a", "attempt"), ("w", "wall-clock"), ("g", "goodput"),
                            ("r", "restart"), ("c", "recompute")]))
    return "\n".join(lines)


@main.command()
@click.option("--db", "--store", "db", type=StoreSpec(),
              help="Store file (no collector may hold it).")
@click.option("--url", help="A running collector to ask instead, e.g. http://127.0.0.1:8470.")
@click.option("--token", envvar="GOODLENS_TOKEN", default=None, help="Token for --url.")
@click.option("--run", "run_id", help="Run id (default: the most recently started run).")
@click.option("--since", help="Window start: epoch s, ISO time, +2h (into the run), -30m (before "
                              "its end).")
@click.option("--until", help="Window end, same forms as --since.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def report(db: str | None, url: str | None, token: str | None, run_id: str | None,
           since: str | None, until: str | None, as_json: bool) -> None:
    """Where the wall-clock went: goodput and every bucket, per run, attempt and window.

    Buckets: productive, straggler_wait, checkpoint_stall, recompute, restart (detection,
    queue, init, restore, warmup, unattributed) and other. They sum to the wall-clock.
    """
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH or --url URL")
    if url:
        import urllib.parse
        q = {k: v for k, v in (("run", run_id), ("since", since), ("until", until)) if v}
        rep = _get_json(url.rstrip("/") + "/v1/report?" + urllib.parse.urlencode(q), token)
    else:
        from goodlens.accounting import report_dict
        store = _open_store(db)
        try:
            try:
                rep = report_dict(store, run_id, since, until)
            except KeyError as exc:
                raise click.ClickException(str(exc.args[0])) from None
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--since/--until") from None
        finally:
            store.close()
    if as_json:
        _echo_json(rep)
    else:
        click.echo(report_text(rep))


def _overrides(pairs: tuple[str, ...], config_type: Any = None,
               settable: Any = None) -> dict[str, Any]:
    """``--set field=value`` pairs typed like the dataclass field they name (default: the
    run simulator's SimConfig; ``settable`` limits the fields accepted)."""
    from dataclasses import fields as dc_fields

    if config_type is None:
        from goodlens.simconfig import SimConfig as config_type
    types = {f.name: str(f.type) for f in dc_fields(config_type)
             if settable is None or f.name in settable}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in types:
            raise click.BadParameter(f"{pair!r}: use FIELD=VALUE with a field of "
                                     f"{', '.join(sorted(types))}", param_hint="--set")
        out[name] = _typed(raw, types[name], name)
    return out


def _typed(raw: str, typ: str, name: str) -> Any:
    try:
        if "bool" in typ:
            return raw.lower() in ("1", "true", "yes", "on")
        if "int" in typ and "float" not in typ:
            return int(raw)
        if "float" in typ:
            return parse_duration(raw) if name.endswith("_s") else float(raw)
    except ValueError as exc:
        raise click.BadParameter(f"{name}={raw!r}: {exc}", param_hint="--set") from None
    return raw


@main.group(invoke_without_command=True)
@click.option("--preset", default="demo-64", show_default=True,
              help="Named configuration: llama3-16k, kokolis-1k, demo-64, test-16.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change one setting (repeatable), e.g. --set interval_s=10m "
                   "--set elastic=spares --set spares=4. Durations accept 90s, 5m, 24h.")
@click.option("--trials", type=click.IntRange(1), default=100, show_default=True,
              help="Monte Carlo trials.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same result.")
@click.option("--sweep", "sweep_spec", metavar="FIELD=V1,V2,...",
              help="Run every value of one setting and print a table ready to plot.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Also write one trial (--seed) as a trace folder: per-rank step rows, "
                   "events, ground_truth.json. For small runs (at most --max-rows rows).")
@click.option("--run-id", default="sim", show_default=True, help="Run id in the --out trace.")
@click.option("--max-rows", type=int, default=50_000_000, show_default=True,
              help="Refuse --out traces bigger than this many rank-step rows.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
@click.pass_context
def simulate(ctx: click.Context, preset: str, sets: tuple[str, ...], trials: int, seed: int,
             sweep_spec: str | None, out: str | None, run_id: str, max_rows: int,
             as_json: bool) -> None:
    """What-if: simulate a training run's goodput under failures, checkpoints, stragglers
    and an elastic policy (Monte Carlo over --trials), in the buckets of `goodlens report`.
    `goodlens simulate cluster` simulates a whole cluster's scheduler instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from dataclasses import replace

    from goodlens import simulate as sim
    from goodlens.presets import get_preset
    try:
        config = replace(get_preset(preset), **_overrides(sets))
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--preset") from None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from None
    if sweep_spec:
        name, _, raw = sweep_spec.partition("=")
        values = [v for v in raw.split(",") if v]
        if not values:
            raise click.BadParameter("use FIELD=V1,V2,...", param_hint="--sweep")
        typed = [next(iter(_overrides((f"{name}={v}",)).values())) for v in values]
        try:
            df = sim.sweep(config, name, typed, trials=trials, seed=seed)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--sweep") from None
        if as_json:
            _echo_json({"preset": preset, "field": name, "trials": trials,
                        "rows": df.to_dict("records")})
        else:
            cols = [c for c in df.columns if c == "value" or c.startswith("goodput")]
            click.echo(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        return
    trace_note = None
    if out:
        rows = config.duration_s / config.step_s * config.nodes * config.gpus_per_node
        if rows > max_rows:
            raise click.UsageError(
                f"--out would write about {rows:,.0f} rank-step rows (limit --max-rows "
                f"{max_rows:,}); shorten it (--set duration_s=2h) or use fewer nodes")
        from goodlens.tracegen import generate_trace
        tr = generate_trace(config, seed, out, run_id=run_id)
        trace_note = {"path": str(tr.path), "run_id": run_id, "seed": seed, "rows": tr.rows,
                      "rows_per_s": tr.rows_per_s, "truth": tr.truth}
    with click.progressbar(length=trials, label=f"simulating {preset} x{trials}",
                           file=sys.stderr, hidden=as_json or not sys.stderr.isatty()) as bar:
        res = sim.monte_carlo(config, trials=trials, seed=seed)
        bar.update(trials)
    out_doc = {"preset": preset, **res}
    if trace_note:
        out_doc["trace"] = trace_note
    out = out_doc
    if as_json:
        _echo_json(out)
        return
    wall = out["wall_clock_s"]
    click.echo(f"{preset}: {config.nodes * config.gpus_per_node:,} GPUs for "
               f"{format_duration(wall)}, {trials} trials")
    click.echo(f"goodput {100 * out['goodput_mean']:.1f}% (p5 {100 * out['goodput_p5']:.1f}%, "
               f"p95 {100 * out['goodput_p95']:.1f}%), GPU-time "
               f"{100 * out['gpu_time_goodput_mean']:.1f}%\n")
    rows = [{"b": b, "t": format_duration(v), "p": f"{100 * v / wall:5.1f}%"}
            for b, v in out["buckets_mean"].items()]
    rows += [{"b": f"  restart.{k}", "t": format_duration(v), "p": f"{100 * v / wall:5.1f}%"}
             for k, v in out["restart_parts_mean"].items() if v]
    click.echo(table(rows, [("b", "bucket (mean)"), ("t", "time"), ("p", "share")]))
    if trace_note:
        click.echo(f"\ntrace of seed {seed}: {trace_note['path']} ({trace_note['rows']:,} "
                   f"rank-step rows; its ground truth: goodput "
                   f"{100 * trace_note['truth']['goodput']:.1f}%, in ground_truth.json)")


@main.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="Store file (no collector may hold it).")
@click.option("--run", "run_id", required=True, help="Run id.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def detect(db: str, run_id: str, as_json: bool) -> None:
    """Find persistent stragglers in a stored run: ranks, hosts or switches slower than the
    rest, from which step, by how much, what they cost, and whether to evict them.
    """
    from goodlens.findings import detect_run, finding_dicts
    found = _read_run(db, run_id, detect_run)
    rows = [{k: _clean(v) for k, v in f.items()} for f in finding_dicts(found)]
    if as_json:
        _echo_json({"run": run_id, "findings": rows})
        return
    if not rows:
        click.echo(f"run {run_id}: no persistent straggler found")
        return
    for r in rows:
        r["subject"] = f"{r['subject_kind']} {r['subject_id']}"
        r["slow"] = f"{100 * r['slowdown']:.1f}%"
        r["cost"] = format_duration(r["straggler_wait_s"])
        r["per_h"] = format_duration(r["wait_per_hour_s"])
    click.echo(table(rows, [("subject", "subject"), ("first_step", "from step"),
                            ("detected_step", "detected at"), ("slow", "slowdown"),
                            ("cost", "wait so far"), ("per_h", "wait per hour"),
                            ("action", "action")]))


@main.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="Store file, opened read-only (no collector may hold it; a running "
                   "collector serves the dashboard itself at its own /).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8471, show_default=True, type=int, help="Port (0: any free).")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def dashboard(db: str, host: str, port: int, log_level: str) -> None:
    """Serve the dashboard alone over a store file: runs, where the wall-clock went, slow
    ranks, checkpoint costs and what-if, with the run id in each page's URL.
    """
    from collector.transport import is_loopback
    from dashboard.asgi import serve_dashboard

    if not is_loopback(host):
        click.echo(f"warning: the dashboard on {host} has no authentication; anyone who "
                   "reaches it can read every run", err=True)

    def ready(bound: int) -> None:
        click.echo(f"goodlens dashboard on http://{host}:{bound}/  (db: {db}, read-only)",
                   err=True)
    try:
        serve_dashboard(db, host, port, ready=ready, log_level=log_level)
    except Exception as exc:  # duckdb.IOException: the file is held by a collector
        if "lock" in str(exc).lower():
            raise click.ClickException(
                f"{db} is held by a running collector; open the dashboard it serves at its "
                "own URL (e.g. http://127.0.0.1:8470/) instead") from None
        raise


def _import_into(db: str, trace: str, quiet: bool) -> dict[str, int]:
    """Open (or create) the store file, import the trace, close."""
    if not db.startswith("parquet:"):  # a dataset folder is made by the store itself
        os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
    store = _open_store(db, read_only=False)
    try:
        return _import(store, trace, quiet=quiet)
    finally:
        store.close()


@main.command("import")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--db", "--store", "db", required=True, type=StoreSpec(),
              help="Store file to load into (created if missing; no collector may hold it).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def import_cmd(trace: str, db: str, as_json: bool) -> None:
    """Load a trace folder (Parquet, see docs/trace-format.md) into a store.

    Rows already stored are recognised and skipped, so importing twice adds nothing.
    """
    totals = _import_into(db, trace, quiet=as_json)
    if as_json:
        _echo_json(totals)
    else:
        click.echo(f"{trace}: {totals['runs']} run(s), {totals['steps_inserted']} step rows and "
                   f"{totals['events_inserted']} events stored ({totals['steps_duplicate']} and "
                   f"{totals['events_duplicate']} already present)")


@main.command()
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--db", "--store", "db", type=StoreSpec(),
              help="Load into this store file, offline (no collector may hold it).")
@click.option("--live", "url", help="Stream through a running collector instead, e.g. "
                                    "http://127.0.0.1:8470.")
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="With --live: times faster than real time (60: a minute per second; "
                   "0: as fast as the collector takes it).")
@click.option("--as-now", is_flag=True,
              help="With --live: shift every timestamp so the trace starts now (a run still "
                   "going then reads as live, not as one that started long ago).")
@click.option("--token", envvar="GOODLENS_TOKEN", default=None, help="Token for --live.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay(trace: str, db: str | None, url: str | None, speed: float, as_now: bool,
           token: str | None, as_json: bool) -> None:
    """Replay a trace folder: offline into a store (--db), or live through a collector's
    ingest at --speed times real time (--live), as if the run were happening.

    Rows already stored are recognised and skipped, so replaying twice adds nothing.
    """
    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db PATH (offline) or --live URL")
    if as_now and not url:
        raise click.UsageError("--as-now shifts a live replay; use it with --live URL")
    if db:
        totals = _import_into(db, trace, quiet=as_json)
    else:
        from collector.replay import stream_trace
        from goodlens.trace import TraceError, read_trace
        if speed < 0:
            raise click.BadParameter("must be >= 0", param_hint="--speed")
        try:
            t = read_trace(trace)
        except TraceError as exc:
            raise click.ClickException(str(exc)) from None
        total = sum(x.num_rows for k, x in t.tables.items() if k in ("steps", "events"))
        with click.progressbar(length=total, label=f"replaying {trace} x{speed:g}",
                               file=sys.stderr, hidden=as_json or not sys.stderr.isatty()) as bar:
            try:
                totals = stream_trace(trace, url, speed=speed, token=token, progress=bar.update,
                                      as_now=as_now)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
    if as_json:
        _echo_json(totals)
    elif db:
        click.echo(f"{trace} -> {db}: {totals['steps_inserted']} step rows and "
                   f"{totals['events_inserted']} events stored ({totals['steps_duplicate']} "
                   f"and {totals['events_duplicate']} already present)")
    else:
        click.echo(f"{trace} -> {url}: {totals['steps']} step rows and {totals['events']} "
                   f"events in {totals['batches']} batches")


@main.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="Store file (no collector may hold it).")
@click.option("--run", "run_ids", multiple=True, required=True, help="Run id (repeatable).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Trace folder to write.")
def export(db: str, run_ids: tuple[str, ...], out: str) -> None:
    """Write runs from a store as a trace folder readable without goodlens."""
    from collector.replay import export_run
    store = _open_store(db)
    try:
        path = export_run(store, list(run_ids), out)
    except KeyError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    finally:
        store.close()
    click.echo(f"wrote {path}")


import goodlens.cli_cluster  # noqa: E402  (registers `goodlens simulate cluster`)
import goodlens.cli_relay as _cli_relay  # noqa: E402, F401  (registers `goodlens relay`)
import goodlens.cli_runs  # noqa: E402, F401  (registers `goodlens end-run`)
from goodlens import cli_plan  # noqa: E402, F401  (registers the `goodlens plan` commands)

if __name__ == "__main__":  # pragma: no cover
    # `python -m goodlens.cli`: this file runs as __main__, a second copy of the module that
    # the plan, cluster and relay modules did not register on; run the registered one
    from goodlens.cli import main as _registered_main
    _registered_main()
