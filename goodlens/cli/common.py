"""What every ``goodlens`` command module shares: parameter types (durations, sizes, store
specs), opening a store with errors a user can act on, talking to a running collector, and
the two output forms (``--json`` through the one conversion, plain-text tables).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from goodlens.model.jsonable import dumps
from goodlens.model.units import parse_bytes, parse_duration

DEFAULT_PORT = 8470
LOG_LEVELS = click.Choice(["critical", "error", "warning", "info", "debug"])


class Duration(click.ParamType):
    """A click parameter accepting ``90s``, ``5m``, ``24h``; yields seconds (``allow_all``:
    also ``all``, infinite)."""

    name = "duration"

    def __init__(self, allow_all: bool = False) -> None:
        self.allow_all = allow_all

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if self.allow_all and str(value).strip().lower() == "all":
            return float("inf")
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class ByteSize(click.ParamType):
    """A size such as ``64MiB``, ``1GB`` or a number of bytes (:func:`parse_bytes`)."""

    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return int(parse_bytes(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def echo_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON, converted by :func:`goodlens.model.jsonable.plain`."""
    click.echo(dumps(obj, indent=2))


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain-text table of ``rows`` with ``(key, header)`` columns."""
    cells = [[header for _, header in columns]]
    for row in rows:
        cells.append(["-" if row.get(k) is None else str(row.get(k)) for k, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def read_run(db: str, run_id: str, read: Any) -> Any:
    """``read(store, run_id)`` over a store opened read-only, after checking the run is
    there (a clear error naming the store when not); the store is closed afterwards."""
    store = open_store(db)
    try:
        if store.run_row(run_id) is None:  # a lookup of one row, no frame (pandas)
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

    def fail(self, message: str, param: Any = None, ctx: Any = None) -> Any:
        """A wrong --db is one line (exit code 2), not click's usage text."""
        raise StoreError(message)

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if text.startswith("parquet:"):
            folder = Path(text[len("parquet:"):])
            if self.exists and not (folder / "_goodlens.json").exists():
                what = "no folder" if not folder.exists() else "no goodlens Parquet dataset"
                self.fail(f"{what} at {folder}; check the path (`goodlens import TRACE --db "
                          f"parquet:{folder}` creates a dataset)", param, ctx)
            return text
        path = Path(text[len("duckdb:"):] if text.startswith("duckdb:") else text)
        if path.is_dir():
            self.fail(f"{path} is a directory; for a Parquet dataset pass parquet:{path}",
                      param, ctx)
        if self.exists and not path.exists():
            self.fail(f"no goodlens store at {path}; check the path (`goodlens import TRACE "
                      f"--db {path}` creates one)", param, ctx)
        return str(path)


class StoreError(click.ClickException):
    """A ``--db`` that does not exist (for a command that reads it) or is not a goodlens
    store (not a DuckDB file, another application's database): one line, exit code 2 (the
    argument is wrong, as with a usage error)."""

    exit_code = 2


def open_store(db: str, read_only: bool = True, init: bool = False) -> Any:
    """Open a DuckDB file or ``parquet:DIR``; a held, missing or foreign file is a clean
    error (exit code 2 for one that is not a goodlens store), a dataset it cannot read one
    line (:func:`dataset_errors`, the trace too under ``--verbose``); ``init`` lets a
    writable open add goodlens's tables to a DuckDB file without them."""
    from goodlens.storage.store import NotAStore, SchemaMismatch
    if str(db).startswith("parquet:"):
        from goodlens.storage.parquet import open_store as open_any
    else:  # a DuckDB file: the dataset's modules (and pyarrow) stay unloaded
        from goodlens.storage.store import open_file as open_any
    try:
        with dataset_errors():  # a dataset's segment it cannot read
            return open_any(db, read_only=read_only, init=init)
    except NotAStore as exc:
        raise StoreError(str(exc)) from None
    except FileNotFoundError as exc:  # a wrong path is a wrong argument: exit code 2
        raise StoreError(f"{exc}; check the path (`goodlens runs --db PATH` lists a store's "
                         "runs; `goodlens import TRACE --db PATH` creates one)") from None
    except (RuntimeError, SchemaMismatch) as exc:
        raise click.ClickException(str(exc)) from None


_VERBOSE = "goodlens.verbose"
VERBOSE_HELP = ("On a failure reading or summarising a dataset, also print the full trace "
                "(DuckDB's traceback, Spark's Java stack and error log) before the one-line "
                "message.")


def verbose_option(f: Any = None, *, expose: bool = False) -> Any:
    """``--verbose`` on a command that reads a store: :func:`dataset_errors` and
    :func:`open_store` then print a failure's full trace (``expose``: the command also
    gets it as its ``verbose`` argument)."""
    def remember(ctx: click.Context, param: Any, value: bool) -> bool:
        ctx.meta[_VERBOSE] = bool(value)
        return value

    def deco(g: Any) -> Any:
        return click.option("--verbose", is_flag=True, callback=remember,
                            expose_value=expose, help=VERBOSE_HELP)(g)
    return deco if f is None else deco(f)


@contextlib.contextmanager
def dataset_errors(verbose: bool | None = None) -> Any:
    """A dataset that cannot be used as it is (an unreadable segment, a pass that would
    change a number silently) as one line, exit code 1; ``verbose`` (default: the
    command's ``--verbose``, :func:`verbose_option`): the full trace (the engine's own
    error, a DuckDB traceback or Spark's Java stack) on stderr first."""
    try:
        yield
    except Exception as exc:
        # only a dataset's modules raise it: a DuckDB file's command never loads them
        guard = sys.modules.get("goodlens.storage.passguard")
        if guard is None or not isinstance(exc, guard.DatasetError):
            raise
        if verbose is None:
            ctx = click.get_current_context(silent=True)
            verbose = bool(ctx and ctx.meta.get(_VERBOSE))
        if verbose:
            import traceback
            traceback.print_exception(exc, file=sys.stderr)
        raise click.ClickException(str(exc)) from None


def token_options(what: str) -> Any:
    """``--token`` (or ``GOODLENS_TOKEN``) and ``--token-file``; the command reads them with
    :func:`read_token`."""
    def deco(f: Any) -> Any:
        f = click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
                         help=f"File whose first line is the {what} (not visible in `ps`, "
                              "unlike --token).")(f)
        return click.option("--token", envvar="GOODLENS_TOKEN", default=None,
                            help=f"The {what} (or env GOODLENS_TOKEN). On the command line it "
                                 "is visible to every user in `ps`: prefer the variable or "
                                 "--token-file.")(f)
    return deco


#: The detector's sensitivity options and the StragglerConfig field each sets.
DETECTOR_OPTIONS = {"threshold_h": "--threshold", "drift_k": "--min-slowdown",
                    "evict_min_slowdown": "--evict-at"}


def detector_options(f: Any) -> Any:
    """``--threshold``, ``--min-slowdown`` and ``--evict-at``: how sure, how slow and how
    costly a straggler must be; the command builds its config with :func:`straggler_config`."""
    f = click.option("--evict-at", type=float, default=0.05, show_default=True,
                     help="Estimated slowdown to reach the collective (the finding's "
                          "`slowdown`, not its `job_slowdown`) from which a lasting "
                          "finding recommends `evict` (0.05: 5%; it goes back to `watch` "
                          "under 80% of this).")(f)
    f = click.option("--min-slowdown", type=float, default=0.01, show_default=True,
                     help="Slowdown against the siblings ignored as no straggler (0.01: "
                          "1%; the detector also ignores 0.4 noise units).")(f)
    return click.option("--threshold", type=float, default=30.0, show_default=True,
                        help="Evidence a subject needs to become a finding, in noise units "
                             "(a one-sided CUSUM). Lower finds weak stragglers sooner and "
                             "makes false findings likelier; docs/detectors.md has the "
                             "measured trade-off.")(f)


def straggler_config(threshold: float, min_slowdown: float, evict_at: float) -> Any:
    """The ``StragglerConfig`` of :func:`detector_options`' values (a usage error naming
    the option when one is out of range)."""
    from goodlens.detectors.stragglers import StragglerConfig
    try:
        return StragglerConfig(threshold_h=threshold, drift_k=min_slowdown,
                               evict_min_slowdown=evict_at)
    except ValueError as exc:
        raise click.UsageError(user_message(str(exc), DETECTOR_OPTIONS)) from None


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The token of ``--token``/``GOODLENS_TOKEN`` or ``--token-file`` (the file wins over
    the variable; both on the command line is an error)."""
    if token_file is None:
        return token or None
    source = click.get_current_context().get_parameter_source("token")
    if token is not None and source == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give --token or --token-file, not both")
    try:
        text = Path(token_file).read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {token_file}: {exc}",
                                 param_hint="--token-file") from None
    if not text or not text[0].strip():
        raise click.BadParameter(f"{token_file} is empty", param_hint="--token-file")
    return text[0].strip()


class CollectorUrl(click.ParamType):
    """``--url``: a collector's base URL; ``host:port`` means ``http://host:port``."""

    name = "URL"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value).strip()
        if not text:
            self.fail("an empty URL: give the collector's address, e.g. 127.0.0.1:8470",
                      param, ctx)
        return collector_url(text)


def collector_url(text: str) -> str:
    """A collector's base URL without a trailing slash; ``http://`` when it names no scheme."""
    text = text.strip()
    return (text if "://" in text else f"http://{text}").rstrip("/")


class CollectorError(click.ClickException):
    """A collector answered with an error (``status``) or could not be reached (0, with
    the ``reason``)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _error_text(raw: bytes) -> str:
    """What a collector's error answer says: its JSON ``error`` text, else the body's text."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return doc["error"]
    text = raw.decode("utf-8", "replace").strip()
    return " ".join(text.split())[:300] or "(an empty answer)"


def get_bytes(url: str, token: str | None, body: Any = None, timeout_s: float = 30.0) -> bytes:
    """GET ``url`` (POST ``body`` as JSON when given) from a collector; the answer's bytes.
    ``host:port/...`` is taken as ``http://``; an error answer raises :class:`CollectorError`
    with the collector's own message."""
    import urllib.error
    import urllib.request
    url = collector_url(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        hint = ("; give the collector's token with --token-file or GOODLENS_TOKEN"
                if exc.code in (401, 403) else "")
        raise CollectorError(f"{url} answered {exc.code}: {_error_text(exc.read())}{hint}",
                             exc.code) from None
    except (OSError, ValueError) as exc:  # ValueError: a URL urllib cannot use
        raise CollectorError(f"cannot reach {url}: {exc}; is `goodlens serve` running?",
                             reason=str(exc)) from None


def get_json(url: str, token: str | None, body: Any = None) -> Any:
    """GET ``url`` (POST ``body`` as JSON when given) from a collector; the JSON answer."""
    raw = get_bytes(url, token, body)
    try:
        return json.loads(raw)
    except ValueError:
        raise CollectorError(f"{collector_url(url)} did not answer JSON ({_error_text(raw)}); "
                             "is it a goodlens collector?") from None


def wait_healthy(url: str, within_s: float = 5.0) -> None:
    """Return once the collector at ``url`` answers ``/healthz``; retried for ``within_s``
    seconds, then a :class:`CollectorError` saying what to do."""
    import time
    deadline = time.monotonic() + within_s
    while True:
        try:
            doc = get_json(collector_url(url) + "/healthz", None)
        except CollectorError as exc:
            if exc.status == 0 and time.monotonic() < deadline:
                time.sleep(0.25)
                continue
            why = exc.reason or exc.message
            raise CollectorError(f"no goodlens collector answers at {collector_url(url)} "
                                 f"({why}; tried /healthz for {within_s:g} s): start one with "
                                 "`goodlens serve --db PATH`, or check the URL",
                                 exc.status) from None
        if isinstance(doc, dict) and doc.get("status") == "ok":
            return
        raise CollectorError(f"{collector_url(url)}/healthz answered {doc!r:.100}: not a "
                             "goodlens collector; check the URL")


def import_trace_file(store: Any, path: str, quiet: bool) -> dict[str, int]:
    """Import a trace folder into an open store, all or nothing, with a progress bar on a
    terminal; a bad trace or a failed write is a one-line error."""
    from goodlens.collector.replay import import_trace
    from goodlens.model.trace import TraceError, read_trace
    from goodlens.storage.store import StoreWriteError, write_failed
    try:
        trace = read_trace(path)
        for run_id in trace.run_ids:  # a run id this store cannot hold (a dataset's limit)
            if (refused := store.run_id_refused(run_id)) is not None:
                raise click.ClickException(f"{refused}; nothing was imported")
        total = sum(t.num_rows for k, t in trace.tables.items() if k in ("steps", "events"))
        with click.progressbar(length=total, label=f"importing {path}", file=sys.stderr,
                               hidden=quiet or not sys.stderr.isatty()) as bar:
            return import_trace(store, path, progress=bar.update)
    except TraceError as exc:
        raise click.ClickException(f"{exc}; nothing was imported") from None
    except StoreWriteError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a Parquet dataset's files
        raise click.ClickException(str(write_failed(store.path, exc))) from None


def import_into(db: str, trace: str, quiet: bool, init: bool = False) -> dict[str, int]:
    """Open (or create) the store file, import the trace, close."""
    if not db.startswith("parquet:"):  # a dataset folder is made by the store itself
        os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
    store = open_store(db, read_only=False, init=init)
    try:
        totals = import_trace_file(store, trace, quiet=quiet)
    except BaseException:
        with contextlib.suppress(Exception):  # a full disk fails the close's checkpoint too
            store.close()
        raise
    store.close()
    return totals


_INTERNAL_PREFIX = re.compile(r"^(?:[a-z_]+: |[A-Z][A-Za-z]+\.)")


def user_message(text: str, options: dict[str, str] | None = None) -> str:
    """A library's ValueError as the user gave the input: without the function or class it
    names (``interval_plan: ``, ``SimConfig.``), and each input name in ``options``
    replaced by the option that sets it (``mtbf_s`` -> ``--mtbf``)."""
    text = _INTERNAL_PREFIX.sub("", text)
    for name in sorted(options or {}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(name)}\b", (options or {})[name], text)
    return text


def overrides(pairs: tuple[str, ...], config_type: Any = None,
               settable: Any = None) -> dict[str, Any]:
    """``--set field=value`` pairs typed like the dataclass field they name (default: the
    run simulator's SimConfig; ``settable`` limits the fields accepted)."""
    from dataclasses import fields as dc_fields

    if config_type is None:
        from goodlens.analysis.runsim.config import SimConfig as config_type
    types = {f.name: str(f.type) for f in dc_fields(config_type)
             if settable is None or f.name in settable}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in types:
            raise click.BadParameter(f"{pair!r}: use FIELD=VALUE with a field of "
                                     f"{', '.join(sorted(types))}", param_hint="--set")
        out[name] = typed_value(raw, types[name], name)
    return out


def typed_value(raw: str, typ: str, name: str) -> Any:
    """``raw`` as the dataclass field type ``typ`` names (durations for ``*_s`` fields)."""
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
