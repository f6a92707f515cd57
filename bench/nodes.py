"""``goodlens nodes``: its time over 10,000 runs on DuckDB, and its false discovery rate and
power over many seeds.

Two parts, both on the fleet generator written for the check (``tests/nodefleet.py``: runs
of 2 to 16 hosts, 2 ranks a host, failures and straggler findings at a rate per host-hour,
two planted hosts at 5x a healthy host's incident rate, survivors' errors, ranks placed
anew each attempt):

- **time**: ``--runs`` runs (default 10,000) over ``--hosts`` hosts (default 2,000) in a
  DuckDB file; ``goodlens nodes --json`` in this process, best of ``--repeat``, against the
  baseline of one DuckDB scan of the same step rows (``SELECT count(DISTINCT host) FROM
  steps``, the least any per-host answer reads). The file is built directly (rows inserted
  with one statement per table, the summaries with the store's own summarising SQL over
  every row): what the collector's writer would leave, minus the hours it takes;
- **statistics**: ``--seeds`` fleets (default 50) of 320 runs over 200 hosts, the node
  table computed from each (no store); the false discovery proportion (healthy hosts among
  those flagged) averaged over seeds against the stated q = 0.05, and the power (the
  planted hosts flagged).

    .venv/bin/python bench/nodes.py [--runs 10000] [--hosts 2000] [--seeds 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine
from click.testing import CliRunner

from goodlens.analysis.nodes import NodeInputs, node_table
from goodlens.cli import main
from goodlens.model.batch import validate_batch
from goodlens.storage.schema import RUN_NAMES, summary_select
from goodlens.storage.store import Store
from tests.nodefleet import LEMON_FAIL, LEMON_SLOW, fleet_docs, frames


def build(path: Path, runs: int, hosts: int) -> dict[str, int]:
    """A DuckDB store of the generated fleet (see the module docstring)."""
    docs = fleet_docs(1, runs, hosts)
    steps, events, meta = [], [], []
    for d in docs:
        b = validate_batch(d)
        run = pa.array([b.run_id] * b.steps.num_rows)
        steps.append(b.steps.append_column("run_id", run))
        events.append(b.events.append_column("run_id", pa.array([b.run_id] * b.events.num_rows)))
        meta.append((b.run_id, *[b.run.get(c) for c in RUN_NAMES]))
    Store(path).close()
    con = duckdb.connect(str(path))
    try:
        con.register("s", pa.concat_tables(steps, promote_options="permissive"))
        con.register("e", pa.concat_tables(events, promote_options="permissive"))
        con.execute("INSERT INTO steps BY NAME SELECT * FROM s")
        con.execute("INSERT INTO events BY NAME SELECT * FROM e")
        con.executemany(f"INSERT INTO runs (run_id, {', '.join(RUN_NAMES)}, first_seen) "
                        f"VALUES (?, {', '.join('?' * len(RUN_NAMES))}, 0)", meta)
        con.execute("INSERT INTO step_summaries " + summary_select("steps"))
        return {"steps": con.execute("SELECT count(*) FROM steps").fetchall()[0][0],
                "events": con.execute("SELECT count(*) FROM events").fetchall()[0][0]}
    finally:
        con.close()


def time_nodes(path: Path, repeat: int) -> tuple[float, float, dict]:
    """Best ``goodlens nodes --json`` and best baseline scan, seconds; the last answer."""
    best, doc = float("inf"), {}
    for _ in range(repeat):
        t = time.perf_counter()
        r = CliRunner().invoke(main, ["nodes", "--db", str(path), "--json"])
        best = min(best, time.perf_counter() - t)
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
    base = float("inf")
    for _ in range(repeat):
        con = duckdb.connect(str(path), read_only=True)
        t = time.perf_counter()
        con.sql("SELECT count(DISTINCT host) FROM steps").fetchall()
        base = min(base, time.perf_counter() - t)
        con.close()
    return best, base, doc


def statistics(seeds: int) -> dict[str, float]:
    fdp, power, false = [], [], 0
    for seed in range(seeds):
        t = node_table(NodeInputs(**frames(fleet_docs(seed, 320))))
        drain = set(t.drain())
        wrong = drain - {LEMON_FAIL, LEMON_SLOW}
        false += len(wrong)
        fdp.append(len(wrong) / max(1, len(drain)))
        power.append(len(drain & {LEMON_FAIL, LEMON_SLOW}) / 2)
    return {"seeds": seeds, "mean_fdp": float(np.mean(fdp)), "power": float(np.mean(power)),
            "healthy_flagged": false, "seeds_with_a_false_flag": int(sum(x > 0 for x in fdp))}


def main_(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--hosts", type=int, default=2_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seeds", type=int, default=50)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.duckdb"
        t0 = time.perf_counter()
        rows = build(path, args.runs, args.hosts)
        built = time.perf_counter() - t0
        best, base, doc = time_nodes(path, args.repeat)
    st = statistics(args.seeds) if args.seeds else None
    print(f"## goodlens nodes\n\n{machine()}\n")
    print("| what | workload | result | baseline | ratio | target |\n|---|---|---|---|---|---|")
    print(f"| `goodlens nodes --json` | {args.runs:,} runs, {args.hosts:,} hosts, "
          f"{rows['steps']:,} step rows, {rows['events']:,} events (built in {built:.0f} s) | "
          f"{best:.2f} s (best of {args.repeat}) | one DuckDB scan of the step rows, "
          f"{base:.3f} s | {best / base:.0f}x | <= 2 s |")
    if st:
        print(f"| false discovery proportion | {st['seeds']} fleets, 320 runs, 200 hosts | "
              f"{st['mean_fdp']:.3f} mean; {st['healthy_flagged']} healthy hosts flagged in "
              f"{st['seeds_with_a_false_flag']} seeds | q = 0.05 stated | | <= 0.05 |")
        print(f"| power | the same | {st['power']:.2f} of the planted hosts flagged | | | "
              "report |")
    print(f"\nflagged in the timed fleet: {doc.get('drain')}")
    print(f"\n`.venv/bin/python bench/nodes.py {' '.join(sys.argv[1:])}`")


if __name__ == "__main__":
    main_()
