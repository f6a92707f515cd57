"""The suite's own xdist scheduler (``tests/conftest.py``) survives a worker that dies.

A native abort in one worker once turned a CI run into a 90-minute timeout: xdist 3.8's
scope scheduler handed the replacement worker a unit with nothing left to run and then
waited on it forever. Here a real ``pytest -n 2`` runs a small tree whose one test aborts
its process; the run must end, report that test as the crash, and run every other test
once, the crashed module's later tests included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from tests.harness import ROOT, kill_tree

pytestmark = pytest.mark.timeout(180)

#: Module stems of the tree: two grouped into one unit as the Spark ones are, one that
#: crashes in its second test, and plain ones.
PLAIN = ("test_a", "test_b", "test_c", "test_d", "test_e")
GROUPED = ("test_spark_summaries", "test_spark_fleet")


def _tree(root: Path) -> None:
    (root / "conftest.py").write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401
        """))
    for stem in PLAIN + GROUPED:
        (root / f"{stem}.py").write_text(
            "import time\n" + "".join(f"def test_{i}():\n    time.sleep(0.05)\n"
                                      for i in range(3)))
    (root / "test_crash.py").write_text(textwrap.dedent("""\
        import os, time
        def test_0():
            time.sleep(0.05)
        def test_1():
            os.abort()
        def test_2():
            time.sleep(0.05)
        """))


def test_a_worker_that_aborts_fails_its_test_and_the_run_still_ends(tmp_path: Path) -> None:
    _tree(tmp_path)
    report = tmp_path / "report.xml"
    # the nested processes import tests/conftest.py, which registers faulthandler on
    # SIGUSR1: without GOODLENS_TEST_STACKS they write their threads to the stderr read here
    env = {k: v for k, v in os.environ.items() if k != "GOODLENS_TEST_STACKS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         f"--junitxml={report}", "."],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)   # so kill_tree stops the controller with its workers
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        # where the controller and each worker wait, then stop them
        for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGUSR1)
        time.sleep(3)
        kill_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"the run did not end after a worker crash:\n{out}\n{err}")
    outcomes: dict[str, list[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes.setdefault(name, []).append("failed" if failed else "passed")
    expected = {f"{stem}.test_{i}": ["passed"] for stem in PLAIN + GROUPED for i in range(3)}
    expected |= {"test_crash.test_0": ["passed"], "test_crash.test_1": ["failed"],
                 "test_crash.test_2": ["passed"]}
    assert proc.returncode == 1, out[-3000:]
    assert outcomes == expected, out[-3000:]
    assert "crashed while running 'test_crash.py::test_1'" in out, out[-3000:]
    # and what the dead worker had run before, for a crash an earlier test set up
    (line,) = [ln for ln in out.splitlines() if "what it had run" in ln]
    assert "test_crash.py" in line, line
