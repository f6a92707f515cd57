"""What the dashboard draws for a state with no number yet, in a real headless Chromium: the
checkpoints page's price box without a price shows its whole placeholder. (The ranks page's
"detection is still running" is decided by the data layer: tests/integration/
test_dashboard_status.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import ROOT, Collector, wait_until

pytestmark = pytest.mark.slow

#: How wide the price box's placeholder is drawn, against the room its field leaves for text.
_FIT = """
var e = document.querySelector('#ckpt-price');
if (!e) return null;
var cs = getComputedStyle(e);
var ctx = document.createElement('canvas').getContext('2d');
ctx.font = cs.font;
return {text: e.placeholder, width: ctx.measureText(e.placeholder).width,
        room: e.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)};
"""


def test_the_price_box_shows_its_whole_placeholder(tmp_path: Path, dash_br) -> None:
    c = Collector(tmp_path / "s.duckdb", "--no-detect", "--load",
                  str(ROOT / "sample_data" / "demo")).start(timeout=120)
    try:
        dash_br.server_url = c.url + "/runs/demo-8x/checkpoints"
        assert wait_until(lambda: dash_br.driver.execute_script(_FIT), timeout=60)
        fit = dash_br.driver.execute_script(_FIT)
        assert fit["text"] == "none"
        assert 0 < fit["width"] <= fit["room"], fit
    finally:
        c.stop()
