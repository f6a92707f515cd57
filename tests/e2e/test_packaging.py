"""What users install: a pure-Python wheel with every asset, whose import graph keeps the
layer contracts (``lint-imports`` over the wheel, where the mapped folders sit where users
get them), and an exporter that works in a training image without the server's packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.harness import ROOT, Collector, http, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (whl,) = out.glob("goodlens-*.whl")
    return whl


def test_the_wheel_is_pure_python_and_carries_every_asset(wheel: Path) -> None:
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = {f"goodlens/dashboard/assets/{p.name}"
              for p in (ROOT / "dashboard" / "assets").iterdir() if p.is_file()}
    assert {"goodlens/dashboard/assets/keep_view.js",
            "goodlens/dashboard/assets/style.css"} <= assets
    assert assets <= names, assets - names
    for folder in ("collector", "dashboard", "detectors"):
        for src in (ROOT / folder).glob("*.py"):
            assert f"goodlens/{folder}/{src.name}" in names
    assert not [n for n in names if n.endswith((".so", ".c", ".pyd"))]
    # a plain install pulls in pyarrow alone: the server and every framework are extras
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip() for line in
                zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["pyarrow>=15"], requires
    for extra in ("torch", "lightning", "transformers", "server"):
        assert any(f'extra == "{extra}"' in r for r in requires), (extra, requires)
    # one import name: nothing but goodlens and its metadata at the top of the wheel
    tops = {n.split("/")[0] for n in names}
    assert tops - {"goodlens"} == {wheel.name.split("-py3")[0] + ".dist-info"}, tops


def test_the_layer_contracts_hold_over_the_installed_tree(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    proc = subprocess.run([str(Path(sys.executable).parent / "lint-imports"),
                           "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tmp_path / "site", env={"PYTHONPATH": str(tmp_path / "site"),
                                                      "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


_BLOCKED = ("duckdb", "pandas", "numpy", "dash", "plotly", "uvicorn", "starlette", "orjson",
            "prometheus_client", "click", "a2wsgi", "torch", "lightning", "transformers",
            "accelerate")
_LIGHT = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {_BLOCKED!r}:
            raise ImportError(f'{{name}} is not installed in this training image')
sys.meta_path.insert(0, Block())
from goodlens.exporter import RankExporter
from goodlens.exporter import relay_client, transport
from goodlens.exporter.recorder import ExporterConfig
url, wire = sys.argv[1], sys.argv[2]
exp = RankExporter(ExporterConfig(url=url, run_id='light-' + wire, rank=0, world_size=1,
                                  wire=wire, flush_interval_s=0.2))
for n in range(50):
    with exp.step(n):
        pass
exp.close()
print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in {_BLOCKED!r}))
"""


@pytest.mark.parametrize("wire", ["arrow", "json"])
def test_the_exporter_works_without_the_server_packages(tmp_path: Path, wire: str) -> None:
    c = Collector(tmp_path / "s.duckdb", "--no-detect", "--no-dashboard").start()
    try:
        proc = subprocess.run([sys.executable, "-c", _LIGHT, c.url, wire], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().replace("'", '"')) == []
        assert "dropped" not in proc.stderr, proc.stderr[-2000:]
        c.sync()
        status, body = http("GET", f"{c.url}/v1/runs")
        assert status == 200
        (run,) = [r for r in body["runs"] if r["run_id"] == f"light-{wire}"]
        assert run["steps"] == 50, run
    finally:
        c.stop()


def test_installed_from_the_wheel_the_dashboard_draws_every_graph(wheel: Path, tmp_path: Path,
                                                                  dash_br) -> None:
    """Not the editable tree: the wheel's files alone (a plain pip install of a pure-Python
    wheel is these files in site-packages), served by `goodlens serve` from elsewhere."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    c = Collector(tmp_path / "s.duckdb", "--no-detect", "--load",
                  str(ROOT / "sample_data" / "demo"))
    c.cwd = tmp_path
    c.env = {**os.environ, "PYTHONPATH": str(site)}
    c.start(timeout=120)
    try:
        status, origin = http("GET", c.url + "/assets/keep_view.js")
        assert status == 200 and "keepView" in origin
        for page, graphs in (("", ("breakdown-graph", "series-graph", "timeline-graph")),
                             ("/ranks", ("heatmap-graph", "host-graph"))):
            dash_br.server_url = c.url + "/runs/demo-8x" + page
            for gid in graphs:
                dash_br.wait_for_element(f"#{gid} .main-svg", timeout=30)
                assert wait_until(lambda gid=gid: dash_br.driver.execute_script(
                    f"const g = document.querySelector('#{gid} .js-plotly-plot');"
                    "return g && g.data ? g.data.length : 0;") > 0, timeout=30), (page, gid)
        logs = [e for e in dash_br.get_logs() if e.get("level") == "SEVERE"]
        assert logs == [], logs
    finally:
        c.stop()
    # the same interpreter and environment import the wheel's files, not the repository's
    where = subprocess.run([sys.executable, "-c", "import goodlens.dashboard.app as a, "
                            "goodlens.collector.server as s; print(a.__file__); "
                            "print(s.__file__)"], cwd=tmp_path, env=c.env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert all(p.startswith(str(site)) for p in where), where
