"""The DuckDB store: one goodlens file, its writer's operations and the read API.

Why this module: a single DuckDB file is the default store (one collector, or offline
analysis of a file no collector holds). Its tables are :mod:`goodlens.storage.schema`'s,
its reads :class:`goodlens.storage.queries.SqlReader`'s, its dedupe
:mod:`goodlens.storage.marks`' and its summaries :mod:`goodlens.storage.summaries`' (the
Parquet dataset shares all four); what is here is what only a file does: opening and
locking it, group-committed inserts and the shadow summaries of a read-only open.

Process model (see docs/architecture.md): DuckDB allows one writing process per file and no
other process may open it while that writer is open, so the collector process owns the
file. Inside it, exactly one thread writes (:class:`goodlens.storage.writer.Writer` calls
:meth:`Store.write_group` and :meth:`Store.summarize_dirty`); readers use their own cursors.
``Store(path, read_only=True)`` opens a file no collector holds (offline analysis).

Idempotency: a batch whose rows all lie above their high-water marks is gathered and
inserted with the rest of its group in one statement, anything else takes an exact
anti-join against stored rows, so re-sending a batch, or replaying a spill file, adds
nothing. Each write records the step range it touched in ``dirty`` in the same transaction,
so a crash before summarising loses nothing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from goodlens.model.schema import SCHEMA_VERSION
from goodlens.storage import reports, summaries
from goodlens.storage.marks import (
    NEW_EVENTS,
    NEW_STEPS,
    Marks,
    PendingMarks,
    WriteResult,
    first_time,
)
from goodlens.storage.queries import SqlReader
from goodlens.storage.schema import (
    DERIVED,
    EVENT_NAMES,
    RUN_NAMES,
    STEP_NAMES,
    SchemaMismatch,
    data_tables,
    summary_ddl,
    upsert_run,
    version_mismatch,
)

if TYPE_CHECKING:  # pyarrow is imported where rows are written: a read (goodlens detect)
    import pyarrow as pa  # loads neither it nor the batch model

    from goodlens.model.batch import Batch

__all__ = ["NotAStore", "SchemaMismatch", "Store", "StoreWriteError", "WriteResult",
           "open_file"]

#: The tables and views goodlens keeps in a DuckDB file.
GOODLENS_TABLES = frozenset({"meta", "runs", "steps", "events", "dirty", "step_summaries",
                             "attempts"})


class NotAStore(RuntimeError):
    """The path is not a goodlens store: not a DuckDB file, or another application's."""


class StoreWriteError(RuntimeError):
    """Writing to the store failed in the file system (a full disk, an I/O error); nothing
    of the failed write was stored."""


def write_failed(path: str, exc: BaseException) -> StoreWriteError:
    """The error for a write to ``path`` that failed with the I/O error ``exc``."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if any(k in text.lower() for k in ("no space left", "disk full", "file too large")):
        hint = ("the disk is full (or the file reached a size limit): free space, or move "
                "the store to a bigger disk, and write again")
    else:
        hint = "check the disk and the file's permissions, then write again"
    return StoreWriteError(f"writing to {path} failed ({text}); nothing of this write was "
                           f"stored, what was committed before is kept; {hint}")


def io_cause(exc: BaseException) -> BaseException | None:
    """The file-system error behind ``exc`` (DuckDB reports the follow-up errors of a
    failed write, such as an aborted transaction, on top of it), or None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, duckdb.IOException | duckdb.FatalException | OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class Store(SqlReader):
    """A goodlens DuckDB file: schema, the writer's operations and the read API."""

    def __init__(self, path: str | Path, *, read_only: bool = False,
                 memory_limit: str | None = None, threads: int | None = None,
                 init: bool = False) -> None:
        """Open (or, writable, create) the store at ``path``. A file that is not a DuckDB
        database, or a DuckDB database without goodlens's ``meta`` table, raises
        :class:`NotAStore`; ``init`` adds goodlens's tables to the latter (never to one that
        has a table of the same name)."""
        super().__init__(self._new_cursor)
        self.path = str(path)
        self.read_only = read_only
        config: dict[str, Any] = {}
        if memory_limit:
            config["memory_limit"] = memory_limit
        if threads:
            config["threads"] = threads
        if not read_only:
            # checkpoint the write-ahead log every 256 MB rather than DuckDB's 16 MB: fewer
            # stalls of the single writer at high ingest rates
            config["checkpoint_threshold"] = "256MB"
        self._con = _connect(self.path, read_only, config)
        try:
            _check_goodlens(self._con, self.path, read_only, init)
        except BaseException:
            self._con.close()
            raise
        self._shadow: pa.Table | None = None
        if read_only:
            self._check_version()
            self._summarize_leftovers()
        else:
            self._con.execute(data_tables() + DERIVED)
            if not self._con.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchall():
                self._con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                  [str(SCHEMA_VERSION)])
            self._check_version()
            self._migrate()
        self._marks = Marks(self._con)
        self._known_runs = {r for (r,) in self._con.execute("SELECT run_id FROM runs").fetchall()}

    def _migrate(self) -> None:
        """A file an earlier goodlens wrote keeps step summaries without the columns added
        since (ready times, ``data_wait_min``), which only the raw rows can give: rebuild the
        table with every column, mark every step range dirty (one transaction) and
        summarise them now, so no read sees a summary without them."""
        if not summaries.stale_columns(self._con):
            return
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute("DROP TABLE step_summaries")
            self._con.execute(DERIVED)
            summaries.mark_all_dirty(self._con)
            self._con.execute("COMMIT")
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self.summarize_dirty()

    def _summarize_leftovers(self) -> None:
        """A file whose collector stopped before summarising everything (a crash, a kill)
        still has dirty step ranges: summarise them into temporary tables that shadow the
        stored ones (in every cursor this store hands out), so reads over the file are exact.
        The file itself is not changed; the next collector to open it summarises for good.
        A file an earlier goodlens wrote, whose summaries lack columns added since, has
        every step summarised that way (until a writable open migrates it for good)."""
        stale = bool(summaries.stale_columns(self._con))
        if not stale and not self._con.execute("SELECT count(*) FROM dirty").fetchall()[0][0]:
            return
        if stale:
            self._con.execute(summary_ddl("CREATE TEMP TABLE"))
            self._con.execute("CREATE TEMP TABLE dirty AS SELECT * FROM main.dirty LIMIT 0")
            summaries.mark_all_dirty(self._con)
        else:
            self._con.execute("CREATE TEMP TABLE step_summaries AS "
                              "SELECT * FROM main.step_summaries")
            self._con.execute("CREATE TEMP TABLE dirty AS SELECT * FROM main.dirty")
        self.summarize_dirty()
        self._shadow = self._con.sql("SELECT * FROM step_summaries").to_arrow_table()

    def _new_cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self._con.cursor()
        if self._shadow is not None:
            # temporary tables belong to one connection: give each cursor its own copy
            cur.register("_shadow", self._shadow)
            cur.execute("CREATE TEMP TABLE step_summaries AS SELECT * FROM _shadow")
            cur.unregister("_shadow")
        return cur

    def _check_version(self) -> None:
        rows = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        row = rows[0] if rows else None
        if row is None or int(row[0]) != SCHEMA_VERSION:
            raise version_mismatch(self.path, row[0] if row else "none",
                                   ". Export it with the goodlens that wrote it, or start a "
                                   "new file.")

    def close(self) -> None:
        """Close the file (checkpointing the write-ahead log)."""
        self._con.close()

    # ------------------------------------------------------------------ writes
    def write_group(self, batches: list[Batch]) -> list[WriteResult]:
        """Write several batches in one transaction (group commit); all or nothing.

        Only the writer thread may call this. When it returns the data is committed. Rows
        that pass the high-water-mark check are gathered and inserted with one statement
        per table for the whole group; the in-memory marks advance only after the commit.
        """
        if self.read_only:
            raise RuntimeError("store opened read-only")
        import pyarrow as pa

        g = _Group(self._con, self._marks.pending())
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            results = [self._write_batch(b, g) for b in batches]
            g.flush()
            reports.mark_changed(con, [b.run_id for b, r in zip(batches, results)
                                       if r.steps_inserted or r.events_inserted or b.run])
            if g.dirty:
                con.register("_dirty", pa.table({
                    "run_id": [k[0] for k in g.dirty], "attempt": [k[1] for k in g.dirty],
                    "lo": [v[0] for v in g.dirty.values()],
                    "hi": [v[1] for v in g.dirty.values()]}))
                con.execute("INSERT INTO dirty SELECT * FROM _dirty")
                con.unregister("_dirty")
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):  # a failed write may have ended it
                con.execute("ROLLBACK")
            cause = io_cause(exc)
            if cause is not None:
                raise write_failed(self.path, cause) from cause
            raise
        g.marks.commit()
        self._known_runs |= g.new_runs
        return results

    def _write_batch(self, b: Batch, g: _Group) -> WriteResult:
        res = WriteResult()
        if b.run or (b.run_id not in self._known_runs and b.run_id not in g.new_runs):
            meta = b.run or {}
            self._con.execute(upsert_run(), [b.run_id, *[meta.get(c) for c in RUN_NAMES],
                                             first_time(b)])
            g.new_runs.add(b.run_id)
        if b.steps is not None and b.steps.num_rows:
            res.steps_inserted = self._insert_steps(b.run_id, b.steps, g)
            res.steps_duplicate = b.steps.num_rows - res.steps_inserted
        if b.events is not None and b.events.num_rows:
            res.events_inserted = self._insert_events(b.run_id, b.events, g)
            res.events_duplicate = b.events.num_rows - res.events_inserted
        return res

    def _insert_steps(self, run_id: str, t: pa.Table, g: _Group) -> int:
        fast, spans = g.marks.check_steps(run_id, t)
        if fast:
            g.add("steps", run_id, t)
            inserted = t.num_rows
        else:
            g.flush()  # rows gathered earlier in this group must be visible to the check
            lo, hi = min(s[1] for s in spans), max(s[2] for s in spans)
            inserted = self._insert_new("steps", NEW_STEPS, t, [run_id, run_id, lo, hi])
        if inserted:
            for a, lo, hi in spans:
                d = g.dirty.get((run_id, a))
                g.dirty[(run_id, a)] = (min(lo, d[0]), max(hi, d[1])) if d else (lo, hi)
        return int(inserted)

    def _insert_events(self, run_id: str, t: pa.Table, g: _Group) -> int:
        if g.marks.check_events(run_id, t):
            g.add("events", run_id, t)
            return t.num_rows
        g.flush()
        return self._insert_new("events", NEW_EVENTS, t, [run_id, run_id])

    def _insert_new(self, table: str, new_rows: str, t: pa.Table, params: list) -> int:
        """Insert the rows of ``t`` not stored yet (the exact anti-join ``new_rows``)."""
        names = STEP_NAMES if table == "steps" else EVENT_NAMES
        self._con.register("_batch", t)
        try:
            return int(self._con.execute(
                f"INSERT INTO {table} (run_id, {', '.join(names)}) SELECT ?, {new_rows}",
                params).fetchall()[0][0])
        finally:
            self._con.unregister("_batch")

    def summarize_dirty(self, con: duckdb.DuckDBPyConnection | None = None,
                        changed: list[str] | None = None) -> int:
        """Recompute the summaries of every dirty step range; returns the steps summarised.

        ``con`` lets a summariser thread use its own cursor while the writer inserts;
        ``changed`` receives the runs whose reports are out of date
        (:func:`goodlens.storage.summaries.summarize_dirty`).
        """
        return summaries.summarize_dirty(con or self._con, changed)

    def external_changes(self) -> bool:
        """Whether other processes may have added rows to summarise (never, for a DuckDB
        file this process owns; a Parquet dataset shared by collectors says yes now and
        then)."""
        return False

    def run_id_refused(self, run_id: str) -> str | None:
        """Why this store cannot hold a run id the ingest API accepts: never, for a DuckDB
        file (a Parquet dataset's folder names are bounded)."""
        return None

    @property
    def warnings(self) -> list[str]:
        """Numbers this store keeps though rows they counted are gone: none in a DuckDB
        file (its rows are never removed behind its back)."""
        return []

    def has_dirty(self) -> bool:
        """Whether some step ranges await summarising."""
        return self._con.execute("SELECT count(*) FROM dirty").fetchall()[0][0] > 0


def open_file(spec: str | Path, *, read_only: bool = False, **kw: Any) -> Store:
    """The DuckDB store ``spec`` names: a path, ``duckdb:PATH`` also accepted (the Parquet
    dataset's ``parquet:DIR`` is :func:`goodlens.storage.parquet.open_store`'s)."""
    return Store(str(spec).removeprefix("duckdb:"), read_only=read_only, **kw)


def _connect(path: str, read_only: bool, config: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """A connection to the DuckDB file at ``path``, or an error saying in one line why not."""
    file = Path(path)
    if read_only and not file.exists():
        raise FileNotFoundError(f"no goodlens store at {path}")
    if not read_only and file.is_file() and file.stat().st_size == 0:
        file.unlink()  # an empty file (mktemp's): a new store
    try:
        return duckdb.connect(path, read_only=read_only, config=config)
    except duckdb.IOException as exc:
        text = str(exc)
        if "lock" in text.lower():
            raise RuntimeError(
                f"{path} is held by another process (a running `goodlens serve`?); "
                "query that collector over HTTP (--url) or stop it first") from None
        if "not a valid DuckDB database" in text:
            raise NotAStore(f"{path} is not a goodlens store: not a DuckDB database file") \
                from None
        raise RuntimeError(f"cannot open {path}: {text.splitlines()[0]}") from None
    except duckdb.Error as exc:  # e.g. a file of a newer DuckDB storage format
        raise NotAStore(f"{path} cannot be opened as a goodlens store: "
                        f"{str(exc).splitlines()[0]}") from None


def _check_goodlens(con: duckdb.DuckDBPyConnection, path: str, read_only: bool,
                    init: bool) -> None:
    """Refuse a DuckDB file that is not goodlens's: one with tables but no ``meta`` (another
    application's) unless ``init``, and even then one with a table goodlens would create."""
    names = {n for (n,) in con.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_catalog = current_database() AND table_schema = 'main'").fetchall()}
    if "meta" in names or (not names and not read_only):
        return
    if read_only:
        raise NotAStore(f"{path} is not a goodlens store: a DuckDB database without "
                        "goodlens's tables (another application's?)")
    clash = sorted(names & GOODLENS_TABLES)
    if not init:
        raise NotAStore(f"{path} is a DuckDB database without goodlens's tables (another "
                        "application's?); refusing to add them: pass --init to add them "
                        "anyway, or use a new file")
    if clash:
        raise NotAStore(f"{path} already has table(s) {', '.join(clash)} that goodlens did "
                        "not create; use a new file")


class _Group:
    """One transaction's pending work: rows gathered for a single INSERT per table, marks
    and dirty ranges that become the store's only once the transaction commits."""

    def __init__(self, con: duckdb.DuckDBPyConnection, marks: PendingMarks) -> None:
        self.con = con
        self.marks = marks
        self.rows: dict[str, list[pa.Table]] = {"steps": [], "events": []}
        self.dirty: dict[tuple[str, int], tuple[int, int]] = {}
        self.new_runs: set[str] = set()

    def add(self, table: str, run_id: str, t: pa.Table) -> None:
        """Gather rows of ``table`` for the group's single INSERT."""
        import pyarrow as pa

        self.rows[table].append(t.add_column(0, "run_id", pa.array([run_id] * t.num_rows,
                                                                   pa.string())))

    def flush(self) -> None:
        """Insert the gathered rows (one statement per table)."""
        import pyarrow as pa

        for name, cols in (("steps", STEP_NAMES), ("events", EVENT_NAMES)):
            pending = self.rows[name]
            if not pending:
                continue
            table = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
            names = ", ".join(["run_id", *cols])
            self.con.register("_rows", table)
            try:
                self.con.execute(f"INSERT INTO {name} ({names}) SELECT {names} FROM _rows")
            finally:
                self.con.unregister("_rows")
            pending.clear()
