"""The same fault schedule two ways, side by side: where each run's wall-clock and
GPU-time went, from ``goodlens report --json`` of each.

Why it exists: ``make demo-ft`` runs the schedule (a group or node killed mid-run, a hot
spare joining, one group or node made slow and then evicted) through torchrun restarts with
DCP checkpoints (``examples/elastic/scenario.py``) and through torchft
(``examples/ft/scenario.py``); this prints what each spent, bucket by bucket.

    python examples/ft/compare.py STORE_A RUN_A STORE_B RUN_B [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from goodlens.analysis.report import report_dict
from goodlens.cli.common import table
from goodlens.model.units import format_duration
from goodlens.storage.store import Store


def report(db: str, run: str) -> dict[str, Any]:
    store = Store(db, read_only=True)
    try:
        return report_dict(store, run)
    finally:
        store.close()


def rows(reps: list[tuple[str, dict[str, Any]]]) -> list[dict[str, str]]:
    """One row per bucket (and part), one column per run: seconds and share."""
    def cell(rep: dict[str, Any], v: float | None) -> str:
        wall = rep["wall_clock_s"]
        return "-" if v is None else f"{format_duration(v)} ({100 * v / wall:.1f}%)"

    out = [{"b": "wall-clock", **{n: format_duration(r["wall_clock_s"]) for n, r in reps}},
           {"b": "goodput", **{n: f"{100 * r['goodput']:.1f}%" for n, r in reps}},
           {"b": "GPU-time goodput", **{n: "-" if r["gpu_time_goodput"] is None else
                                        f"{100 * r['gpu_time_goodput']:.1f}%"
                                        for n, r in reps}}]
    for b in reps[0][1]["buckets"]:
        out.append({"b": b, **{n: cell(r, r["buckets"][b]) for n, r in reps}})
        for part in sorted({k for _, r in reps for k, v in (r.get(f"{b}_parts") or {}).items()
                            if v}):
            out.append({"b": f"  {part}", **{n: cell(r, (r.get(f"{b}_parts") or {})
                                                     .get(part, 0.0)) for n, r in reps}})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pairs", nargs="+", metavar="STORE RUN", help="store file and run id, twice")
    p.add_argument("--json", action="store_true", help="the two reports as JSON")
    args = p.parse_args(argv)
    if len(args.pairs) % 2:
        p.error("give a store and a run id for each run")
    reps = [(f"{run} ({'torchft' if 'fault_tolerance' in r else 'restart'})", r)
            for db, run in zip(args.pairs[::2], args.pairs[1::2])
            for r in [report(db, run)]]
    if args.json:
        print(json.dumps({n: r for n, r in reps}, indent=1, default=str))
        return 0
    print(table(rows(reps), [("b", "bucket"), *[(n, n) for n, _ in reps]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
