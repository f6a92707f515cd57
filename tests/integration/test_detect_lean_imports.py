"""``goodlens detect`` over a DuckDB file stays lean: it loads neither pandas nor pyarrow (nor
the server's or the dashboard's packages).

Why: the whole command (a fresh process) should take about 1 s on 2,048 ranks x 3,000
steps (docs/benchmarks.md), and importing pandas alone takes half of that. The command
reads arrays and rows (``run_row``, ``ready_matrix``, ``rank_host_map``) and imports
pandas and pyarrow only where other commands need them; one module-level import on its
path would quietly bring them back, so the command is run in a fresh interpreter and what
it loaded is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from goodlens.collector.replay import import_trace
from goodlens.storage.store import Store
from tests.harness import ROOT

SAMPLE = ROOT / "sample_data" / "demo"

#: Packages ``goodlens detect --db FILE`` must not import.
HEAVY = ("pandas", "pyarrow", "dash", "plotly", "starlette", "uvicorn", "scipy")

_RUN = f"""
import sys
from goodlens.cli import main
try:
    main(sys.argv[1:], prog_name="goodlens")
except SystemExit as exc:
    assert not exc.code, exc.code
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print("LOADED", *loaded, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("lean") / "demo.duckdb"
    store = Store(path)
    try:
        import_trace(store, SAMPLE)
    finally:
        store.close()
    return str(path)


@pytest.mark.parametrize("as_json", [True, False])
def test_detect_imports_neither_pandas_nor_pyarrow(demo_db: str, as_json: bool) -> None:
    args = ["detect", "--db", demo_db, "--run", "demo-8x", *(["--json"] if as_json else [])]
    proc = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if as_json:   # it did detect: the demo's planted straggler, rank 5
        found = json.loads(proc.stdout)["findings"]
        assert [(f["subject_kind"], f["subject_id"]) for f in found] == [("rank", 5)]
    else:
        assert "rank 5" in proc.stdout
    loaded = proc.stderr.strip().splitlines()[-1].split()
    assert loaded == ["LOADED"], f"goodlens detect imported {loaded[1:]}"
