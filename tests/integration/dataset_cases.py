"""The Parquet dataset cases every summarising engine must get right, shared by the DuckDB
tests (test_dataset_guard.py) and the Spark ones (test_spark.py, whose session they reuse).

Each case builds a small dataset with hand-known rows (``tests.harness.step_batch``: rank r
computes 0.6 + 0.01 r s, waits 0.38 - 0.01 r s in the collective, so the highest rank is
the slowest; step s starts at 1000 + s) and checks what ``goodlens summarize`` does with it
against values written out here by hand.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import Result

from goodlens.model.batch import validate_batch
from goodlens.storage import ckptfiles
from goodlens.storage.parquet import ParquetStore
from tests.harness import step_batch

#: Run ids users give, and the folder name each must get (written out by hand): ASCII
#: specials as %XX, other characters as themselves, the one value engines read as null
#: escaped.
FOLDERS = {
    "a b/c=d%e ü": "run_id=a%20b%2Fc%3Dd%25e%20ü",
    "team/llama=70b": "run_id=team%2Fllama%3D70b",
    "训练-日本語": "run_id=训练-日本語",
    "__HIVE_DEFAULT_PARTITION__": "run_id=%5F_HIVE_DEFAULT_PARTITION__",
    "NULL": "run_id=NULL",
    "tab\there": "run_id=tab%09here",
}
#: What every run above holds: 3 ranks x steps 0-2.
PER_RUN = {"ranks": [3, 3, 3], "slowest_rank": [2, 2, 2], "compute_max": [0.62] * 3,
           "step_start": [1000.0, 1001.0, 1002.0]}

Summarize = Callable[..., Result]


def write(root: Path, writer: str, batches: list[dict]) -> None:
    """Store ``batches`` as one write group of a writer that saves (and so prunes) no
    checkpoint on closing: the passes under test write them."""
    s = ParquetStore(root, writer_id=writer, use_checkpoints=False)
    s.write_group([validate_batch(b) for b in batches])
    s.save_summaries = lambda *a, **k: []  # type: ignore[method-assign]
    s.close()


def ranks_of(root: Path, run: str) -> dict[int, int]:
    t = ckptfiles.best_checkpoint(root, run)
    assert t is not None, f"no checkpoint of {run!r}"
    return dict(zip(t.column("step").to_pylist(), t.column("ranks").to_pylist()))


def checkpoints(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "summaries").glob("*/*.parquet"))


def one_line(r: Result, code: int) -> str:
    """The failure's text, after checking it is one line and the exit code."""
    assert r.exit_code == code, r.output
    text = r.output.strip()
    assert text.count("\n") == 0 and "Traceback" not in text and "\tat " not in text, text
    return text


def ids_round_trip(root: Path, summarize: Summarize) -> None:
    write(root, "a", [step_batch(run, r, [0, 1, 2]) for run in FOLDERS for r in range(3)])
    assert sorted(p.name for p in (root / "steps").iterdir()) == sorted(FOLDERS.values())
    r = summarize(root)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (root / "summaries").iterdir()) == sorted(FOLDERS.values())
    for run in FOLDERS:
        t = ckptfiles.best_checkpoint(root, run).sort_by("step")
        assert t.column("run_id").to_pylist() == [run] * 3
        for name, want in PER_RUN.items():
            assert t.column(name).to_pylist() == want, (run, name)


def legacy_folder(root: Path, summarize: Summarize) -> None:
    """A run an earlier goodlens stored under percent-encoded UTF-8 (``%C3%BC``), continued
    by today's writer under today's name: one run, whichever folder holds its rows."""
    run = "a b ü"
    write(root, "old", [step_batch(run, r, [0, 1, 2]) for r in range(3)])
    os.rename(root / "steps" / "run_id=a%20b%20ü", root / "steps" / "run_id=a%20b%20%C3%BC")
    write(root, "new", [step_batch(run, 3, [0, 1, 2])])  # a fourth rank, today's folder
    assert (root / "steps" / "run_id=a%20b%20ü").is_dir()
    r = summarize(root)
    assert r.exit_code == 0, r.output
    assert checkpoints(root) == [f"summaries/run_id=a%20b%20ü/{n}" for n in
                                 os.listdir(root / "summaries" / "run_id=a%20b%20ü")]
    assert ranks_of(root, run) == {0: 4, 1: 4, 2: 4}


def unreadable_covered_then_late_rows(root: Path, summarize: Summarize) -> None:
    """A checkpoint counts 4 ranks for steps 0-9; their segment turns unreadable; a late
    rank's rows for steps 3-5 arrive. Never summarised again from the late rows alone."""
    write(root, "a", [step_batch("r", k, list(range(10))) for k in range(4)])
    assert summarize(root).exit_code == 0
    assert ranks_of(root, "r") == dict.fromkeys(range(10), 4)
    (seg,) = (root / "steps").glob("*/*/*.parquet")
    write(root, "late", [step_batch("r", 4, [3, 4, 5])])
    seg.write_bytes(b"not parquet any more")
    before = checkpoints(root)
    text = one_line(summarize(root), 1)
    assert f"cannot read {seg}" in text and "nothing was written" in text
    assert checkpoints(root) == before
    # the file moved out: now its rows are gone, and the late rows alone would say 1 rank
    seg.rename(root / "moved-out.parquet")
    text = one_line(summarize(root), 1)
    assert "fewer ranks than its checkpoint counted (attempt 0 step 3: 1 rank(s), was 4)" \
        in text and str(seg) in text and "summaries/run_id=r" in text
    assert checkpoints(root) == before
    # the way out the message names: drop the checkpoint, summarise what is left
    shutil.rmtree(root / "summaries" / "run_id=r")
    assert summarize(root).exit_code == 0
    assert ranks_of(root, "r") == {3: 1, 4: 1, 5: 1}


def corrupt_new_segment(root: Path, summarize: Summarize) -> None:
    write(root, "a", [step_batch("r", k, [0, 1]) for k in range(2)])
    (seg,) = (root / "steps").glob("*/*/*.parquet")
    good = seg.read_bytes()
    seg.write_bytes(good[: len(good) // 2])  # truncated
    text = one_line(summarize(root), 1)
    assert text.startswith(f"Error: cannot read {seg} (") and "nothing was written" in text
    assert checkpoints(root) == []
    seg.write_bytes(good)
    assert summarize(root).exit_code == 0 and ranks_of(root, "r") == {0: 2, 1: 2}
    assert pq.read_metadata(seg).num_rows == 4


def missing_path(tmp: Path, summarize: Summarize) -> None:
    text = one_line(summarize(tmp / "nowhere"), 2)
    assert f"no folder at {tmp / 'nowhere'}" in text
    (tmp / "plain").mkdir()
    text = one_line(summarize(tmp / "plain"), 2)
    assert f"no goodlens Parquet dataset at {tmp / 'plain'}" in text
