"""What a summarising pass refuses to do silently, and its failures as one line each.

Why a module of its own: a summary checkpoint is trusted by every later reader, whichever
engine wrote it, so a pass that would save a wrong one must stop before saving anything.
Three checks stand between an engine's result and the checkpoints
(:func:`goodlens.storage.bulk.summarize_dataset` runs them for DuckDB and Spark alike):

- every summary row belongs to a run whose folder the pass read (an engine that decodes a
  folder name differently, or reads it as null, attributes rows to no run);
- every run with new rows got summaries;
- no step is summarised again from fewer ranks than the checkpoint it replaces had (rows a
  checkpoint counted are gone: a segment removed or unreadable). The rule is to refuse:
  the pass names the run and what to do, and writes nothing.

A live summariser (:class:`goodlens.storage.parquet.ParquetStore`'s, a collector's or a
reader's) applies the same comparison (:func:`fewer_ranks`) but cannot refuse: it keeps
such a step's earlier figures and says so once per run.

A failure is a :class:`DatasetError`: one line that names the file or run and says what to
do; the engine's own error (a DuckDB traceback, a Java stack) stays its ``__cause__``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa


class DatasetError(RuntimeError):
    """A dataset a pass or a reader cannot use as it is: one line, saying what to do."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an error's text, at most ``limit`` characters."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def named_file(exc: BaseException, files: list[str]) -> str | None:
    """The one of ``files`` an engine's error names (by its segment name, which is unique
    in a dataset; engines print paths in their own encodings), else None."""
    text = str(exc)
    for f in files:
        if os.path.basename(f) in text:
            return f
    return None


def unreadable(path: str | Path, exc: BaseException, root: Path) -> DatasetError:
    """The error for a segment that is present but cannot be read."""
    return DatasetError(
        f"cannot read {path} ({first_line(exc)}): restore it from a copy, or move it out of "
        f"{root} to summarise without its rows; nothing was written")


def engine_failed(engine: str, exc: BaseException, files: list[str], root: Path,
                  hint: str = "run again with --verbose for the engine's own error"
                  ) -> DatasetError:
    """The error for an engine call that failed: naming the segment it names, if any."""
    path = named_file(exc, files)
    if path is not None:
        return unreadable(path, exc, root)
    return DatasetError(f"{engine or 'the engine'} failed summarising {root} "
                        f"({first_line(exc)}); nothing was written: {hint}")


def check_attribution(fresh: dict[str | None, pa.Table], expected: dict[str, int], root: Path,
                      engine: str) -> None:
    """Every run of the engine's summaries is one the pass read (``fresh``: summaries by
    run id, None's key for rows with no run id), and every run with new rows
    (``expected``: run id -> rows in its new segments) has summaries."""
    strays = sorted("null" if r is None else repr(r) for r in fresh if r not in expected)
    if strays:
        raise DatasetError(
            f"{engine} attributed rows of {root / 'steps'} to run id {strays[0]}, which no "
            "run folder there names (a folder name it decodes differently, or as null); "
            "nothing was written: move that folder's segments into the folder this goodlens "
            f"names the run (`run_id=<id>`, docs/scaling.md), or summarise with --engine "
            "duckdb")
    for run, rows in sorted(expected.items()):
        if rows and (run not in fresh or not fresh[run].num_rows):
            raise DatasetError(
                f"{engine} found no rows of run {run!r} in its {rows:,} new row(s) under "
                f"{root / 'steps'} (rows it read under another run id?); nothing was "
                "written: run again with --engine duckdb, or report a bug with the folder "
                "name")


def check_sources(run: str, base: pa.Table | None, boxes: list[tuple[int, int, int, int]],
                  fresh: pa.Table | None, missing: list[str], key_folder: Path) -> None:
    """Refuse to replace a checkpoint's step with one summarised from fewer ranks (or
    none): ``base`` is the checkpoint's summaries, ``boxes`` the steps recomputed,
    ``fresh`` their new summaries, ``missing`` the checkpoint's segments no longer
    present."""
    fewer, was, now = fewer_ranks(base, boxes, fresh)
    if not fewer:
        return
    gone = f" ({missing[0]} is gone)" if missing else ""
    raise DatasetError(
        f"{fewer_text(run, fewer, was, now, 'than its checkpoint counted')}: rows the "
        f"checkpoint counted are gone{gone}; nothing was written: restore them, or, if they "
        f"were removed on purpose, delete {key_folder} to summarise the run from the rows "
        "that are left")


Steps = dict[tuple[int, int], int]


def fewer_ranks(base: pa.Table | None, boxes: list[tuple[int, int, int, int]],
                fresh: pa.Table | None) -> tuple[list[tuple[int, int]], Steps, Steps]:
    """The steps (attempt, step) of ``base`` inside ``boxes`` (first and last attempt,
    first and last step) that ``fresh`` summarises from fewer ranks than ``base`` did, or
    not at all, in order; with the ranks each counted before and now (the one rule every
    summariser applies: a step's ranks never drop without its being said)."""
    if base is None or not base.num_rows:
        return [], {}, {}
    att = base.column("attempt").to_numpy()
    st = base.column("step").to_numpy()
    inside = np.zeros(len(att), dtype=bool)
    for a0, a1, s0, s1 in boxes:
        inside |= (att >= a0) & (att <= a1) & (st >= s0) & (st <= s1)
    if not inside.any():
        return [], {}, {}
    was = {(int(a), int(s)): int(r) for a, s, r in zip(
        att[inside], st[inside], base.column("ranks").to_numpy()[inside])}
    now: Steps = {}
    if fresh is not None and fresh.num_rows:
        now = {(int(a), int(s)): int(r) for a, s, r in zip(
            fresh.column("attempt").to_numpy(), fresh.column("step").to_numpy(),
            fresh.column("ranks").to_numpy())}
    return sorted(k for k, r in was.items() if now.get(k, 0) < r), was, now


def fewer_text(run: str, fewer: list[tuple[int, int]], was: Steps, now: Steps,
               than: str) -> str:
    """What :func:`fewer_ranks` found, as the start of a message (the first such step)."""
    a, s = fewer[0]
    return (f"run {run!r}: {len(fewer):,} step(s) would be summarised again from fewer ranks "
            f"{than} (attempt {a} step {s}: {now.get((a, s), 0)} rank(s), was {was[(a, s)]})")


#: ``%XX`` as Spark and Hive decode it: one character per code.
_CODE = re.compile(r"%([0-9A-Fa-f]{2})")


def spark_reads(value: str) -> str | None:
    """The run id Spark's (and Hive's) partition discovery reads from a folder value:
    each ``%XX`` one character, ``__HIVE_DEFAULT_PARTITION__`` and empty as null."""
    if value in ("", "__HIVE_DEFAULT_PARTITION__"):
        return None
    return _CODE.sub(lambda m: chr(int(m.group(1), 16)), value)
