"""The suite's own xdist settings (``addopts`` in pyproject.toml) end a run whose worker dies.

Under ``--dist loadfile`` xdist 3.8 replaces a crashed worker, hands it the crashed module
again, and then waits on it forever: a native abort in one test hung the whole run, past
every per-test timeout. With ``--max-worker-restart=0`` no replacement starts: the run
ends, with the test that crashed failed. Here a real ``pytest -n 2`` with the suite's xdist
options runs a small tree whose one test aborts its process.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.harness import ROOT, kill_tree

pytestmark = pytest.mark.timeout(180)


def _xdist_options() -> list[str]:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return [o for o in shlex.split(ini["addopts"])
            if o.startswith(("--dist", "--no-loadscope", "--max-worker-restart"))]


def test_a_worker_that_aborts_fails_its_test_and_the_run_ends(tmp_path: Path) -> None:
    opts = _xdist_options()
    assert "--dist=loadfile" in opts and "--max-worker-restart=0" in opts
    for stem in ("test_a", "test_b"):
        (tmp_path / f"{stem}.py").write_text("def test_0():\n    pass\n")
    (tmp_path / "test_crash.py").write_text("import os\n\n\ndef test_0():\n    os.abort()\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # xdist alone (no other plugin's start-up in the three processes)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist",
         "-n", "2", *opts, "."], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        start_new_session=True)   # so kill_tree stops the controller with its workers
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, _ = proc.communicate()
        pytest.fail(f"the run did not end after a worker crash:\n{out[-3000:]}")
    assert proc.returncode == 1, out[-3000:]
    assert "crashed while running 'test_crash.py::test_0'" in out, out[-3000:]
