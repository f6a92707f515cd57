"""Every command given a file that is not a goodlens store says so in one line and exits 2,
and changes nothing in another application's database; `import` is all or nothing; a write
that fails in the file system (a full disk) says what happened and what to do.
"""

from __future__ import annotations

import hashlib
import resource
import subprocess
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from goodlens.cli import main
from goodlens.storage.store import Store
from tests.harness import GOODLENS, ROOT

SAMPLE = ROOT / "sample_data" / "demo"
COMMANDS = [
    ["runs", "--db", "{db}"],
    ["report", "--db", "{db}"],
    ["detect", "--db", "{db}", "--run", "x"],
    ["export", "--db", "{db}", "--run", "x", "--out", "{tmp}/out"],
    ["import", str(SAMPLE), "--db", "{db}"],
    ["replay", str(SAMPLE), "--db", "{db}"],
    ["end-run", "--db", "{db}", "--run", "x"],
    ["plan", "--db", "{db}", "--run", "x"],
    ["dashboard", "--db", "{db}", "--port", "0"],
    ["serve", "--db", "{db}", "--port", "0", "--no-detect"],
]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def not_stores(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "notes.duckdb"
    text.write_text("these are my notes, not a database\n" * 40)
    foreign = tmp_path / "crm.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE customers (id INTEGER, name VARCHAR)")
    con.execute("INSERT INTO customers VALUES (1, 'Ada')")
    con.close()
    return {"text": text, "foreign": foreign}


@pytest.mark.parametrize("kind", ["text", "foreign"])
def test_every_command_refuses_a_file_that_is_not_a_store(tmp_path, not_stores, kind):
    db = not_stores[kind]
    before = _digest(db)
    for cmd in COMMANDS:
        args = [a.format(db=db, tmp=tmp_path) for a in cmd]
        if cmd[0] in ("serve", "dashboard"):  # servers: a real process (signal handlers)
            proc = subprocess.run([*GOODLENS, *args], capture_output=True, text=True,
                                  timeout=60)
            code, out = proc.returncode, (proc.stdout + proc.stderr).strip()
        else:
            result = CliRunner().invoke(main, args, catch_exceptions=False)
            code, out = result.exit_code, result.output.strip()
        assert code == 2, (args, code, out)
        assert len(out.splitlines()) == 1 and "Traceback" not in out, (args, out)
        assert str(db) in out and ("not a goodlens store" in out
                                   or "without goodlens's tables" in out), (args, out)
        if kind == "foreign" and cmd[0] in ("import", "replay", "serve"):
            assert "--init" in out, out
    assert _digest(db) == before
    if kind == "foreign":
        con = duckdb.connect(str(db), read_only=True)
        tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables")
                  .fetchall()}
        con.close()
        assert tables == {"customers"}


def test_init_adds_goodlens_tables_beside_another_applications(not_stores):
    db = not_stores["foreign"]
    result = CliRunner().invoke(main, ["import", str(SAMPLE), "--db", str(db), "--init"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["runs", "--db", str(db)], catch_exceptions=False)
    assert "demo-8x" in result.output
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT name FROM customers").fetchall() == [("Ada",)]
    con.close()


def test_a_parquet_folder_of_other_files_is_refused(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8")
    result = CliRunner().invoke(main, ["import", str(SAMPLE), "--db", f"parquet:{folder}"],
                                catch_exceptions=False)
    assert result.exit_code == 2 and "--init" in result.output, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["cat.jpg"]


def _broken_trace(tmp_path: Path, table: str, column: str) -> Path:
    trace = tmp_path / f"no-{column}"
    subprocess.run(["cp", "-r", str(SAMPLE), str(trace)], check=True)
    path = trace / f"{table}.parquet"
    pq.write_table(pq.read_table(path).drop_columns([column]), path)
    return trace


@pytest.mark.parametrize(("table", "column"), [("steps", "duration_s"), ("events", "kind"),
                                               ("steps", "run_id")])
def test_import_of_a_trace_missing_a_column_imports_nothing(tmp_path, table, column):
    trace = _broken_trace(tmp_path, table, column)
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(main, ["import", str(trace), "--db", str(db)],
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    out = result.output.strip()
    assert len(out.splitlines()) == 1 and column in out and "nothing was imported" in out
    store = Store(db, read_only=True)
    try:
        assert store.runs().empty
        assert len(store.steps("demo-8x")) == 0
    finally:
        store.close()


def test_a_full_disk_says_what_happened(tmp_path):
    """The file-size limit stands in for a full disk: the same failed write in DuckDB."""
    db = tmp_path / "full.duckdb"

    def small_files() -> None:  # Python ignores SIGXFSZ: the write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_500_000, 1_500_000))

    proc = subprocess.run([*GOODLENS, "import", str(ROOT / "sample_data" / "sim-64"), "--db",
                           str(db)], capture_output=True, text=True, timeout=120,
                          preexec_fn=small_files)
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 1, out
    assert len(out.splitlines()) == 1 and "Traceback" not in out, out
    assert f"writing to {db} failed" in out and "nothing of this write was stored" in out
    assert "no transaction is active" not in out
    result = CliRunner().invoke(main, ["runs", "--db", str(db)], catch_exceptions=False)
    assert result.exit_code == 0 and "no runs yet" in result.output, result.output


def test_token_file_for_client_commands(tmp_path, collector):
    token = tmp_path / "t"
    token.write_text("x\n")
    both = CliRunner().invoke(main, ["runs", "--url", collector.url, "--token", "a",
                                     "--token-file", str(token)])
    assert both.exit_code == 2 and "not both" in both.output
    ok = CliRunner().invoke(main, ["runs", "--url", collector.url, "--token-file", str(token)],
                            catch_exceptions=False)
    assert ok.exit_code == 0, ok.output  # a token-less collector ignores it
