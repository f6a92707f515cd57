"""Record real runs for the exact replays (``tests/recorded.py``).

Each recipe runs one real job live (torchrun, gloo, a real collector), with the faults the
replay tests plant, and returns what it left; :func:`save` keeps what the collector stored
(its own findings left out: the replay makes them again), the job's own clock and the
job's settings under ``tests/fixtures/runs/NAME/``.

Run ``make record-fixtures`` (every recipe) or ``make record-fixtures ONLY="ddp-slow hf"``
when the exporter's wire output or a job's clock lines change, on a quiet machine; then run
the replay tests, and commit the new recordings with the reason in the message. Recipes live
in this package's modules, one per family of jobs, each registering with :func:`recipe`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.recorded import CLOCK, FIXTURES, JOB, write_clock


@dataclasses.dataclass
class Capture:
    """What a recipe's live job left: the collector's store, the run, the job's clock
    folder, and facts for the tests (settings, sizes of files the job wrote)."""

    db: Path
    run_id: str
    truth_dir: Path | None
    job: dict[str, Any]


RECIPES: dict[str, Callable[[Path], Capture]] = {}


def recipe(name: str) -> Callable[[Callable[[Path], Capture]], Callable[[Path], Capture]]:
    """Register a recipe under ``name`` (the fixture folder's name)."""
    def add(fn: Callable[[Path], Capture]) -> Callable[[Path], Capture]:
        if name in RECIPES:
            raise ValueError(f"two recipes named {name}")
        RECIPES[name] = fn
        return fn
    return add


def save(name: str, cap: Capture, out: Path = FIXTURES) -> Path:
    """Write ``cap`` as the recording ``out/name`` (replacing an older one)."""
    import pyarrow.compute as pc

    from goodlens.model.trace import write_trace
    from goodlens.storage.store import Store

    store = Store(cap.db, read_only=True)
    try:
        tables = {t: store.table(t, cap.run_id) for t in ("runs", "steps", "events")}
    finally:
        store.close()
    ev = tables["events"]
    mine = pc.invert(pc.starts_with(ev.column("source"), "detector/"))
    tables["events"] = ev.filter(mine)   # the collector's findings: the replay makes them
    dest = out / name
    tmp = out / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write_trace(tmp, tables, [cap.run_id])
    lines = write_clock(cap.truth_dir, tmp / CLOCK) if cap.truth_dir else 0
    import torch
    job = {"name": name, "run_id": cap.run_id, **cap.job,
           "recorded": {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                        "python": platform.python_version(), "cpus": os.cpu_count(),
                        "cpu": _cpu_model(), "load_1m": round(os.getloadavg()[0], 2)},
           "rows": {"steps": tables["steps"].num_rows, "events": tables["events"].num_rows,
                    "clock_lines": lines}}
    (tmp / JOB).write_text(json.dumps(job, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def script_module(name: str, path: Path) -> Any:
    """The example script at ``path`` as module ``name``, loaded once (a script, not a
    package: ``examples/elastic/scenario.py``, ``examples/ft/scenario.py``)."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def timeline(summary: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A scenario's timeline marks with their time after the first, keeping ``key``
    (the node or group a mark names) where a mark has it."""
    t0 = summary["timeline"][0]["t"]
    return [{"what": m["what"], "t": m["t"], "after_s": round(m["t"] - t0, 3),
             **({key: m[key]} if key in m else {})} for m in summary["timeline"]]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _load_recipes() -> None:
    from tests.record import ddp, elastic, frameworks, ft, jobcost, restore  # noqa: F401 (they register)


def main(argv: list[str]) -> int:
    _load_recipes()
    names = argv or sorted(RECIPES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        print(f"unknown recipes {unknown}; known: {' '.join(sorted(RECIPES))}", file=sys.stderr)
        return 2
    for name in names:
        t = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"record-{name}-") as tmp:
            cap = RECIPES[name](Path(tmp))
            dest = save(name, cap)
        size = sum(f.stat().st_size for f in dest.iterdir())
        print(f"{name}: {dest.relative_to(FIXTURES.parents[2])} ({size / 1024:.0f} KiB) "
              f"in {time.monotonic() - t:.0f} s", flush=True)
    return 0
