"""The runs list in a real headless Chromium over a real collector holding 55 runs: sorted,
filtered and paged by the server, its view in the URL so a copied link reproduces it.

Run ``r<i>`` (i = 0..54) starts at t0, runs its 2 one-second steps from t0 + 1 + i and ends
with them: wall-clock 3 + i s, of which 2 s productive, so its goodput is 2 / (3 + i), by
hand: r00 66.7%, r01 50.0%, r54 3.5%, and the goodput order is the reverse of the id order.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest

from tests.harness import Collector, enter_text, http, wait_until

pytestmark = pytest.mark.slow
T0 = 2_000_000.0
RUNS = 55


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory):
    c = Collector(tmp_path_factory.mktemp("runs") / "store.duckdb", "--no-detect").start()
    for i in range(RUNS):
        run, first = f"r{i:02d}", T0 + 1 + i
        doc = {"schema_version": 1, "run_id": run, "run": {"world_size": 1},
               "events": {"source": "launcher", "seq": [0, 1],
                          "kind": ["attempt_start", "attempt_end"],
                          "time": [T0, first + 2], "attempt": 0,
                          "cause": [None, "completed"]},
               "steps": {"attempt": 0, "rank": 0, "host": "h0", "step": [0, 1],
                         "start_time": [first, first + 1], "duration_s": [1.0, 1.0],
                         "compute_s": [1.0, 1.0]}}
        assert http("POST", c.url + "/v1/ingest", json.dumps(doc).encode())[0] == 200
    c.sync()
    yield c
    c.stop()


def _rows(dash_br) -> list[str]:
    """The run ids and goodput cells of the table, read in one script call (it redraws)."""
    return dash_br.driver.execute_script(
        "return Array.from(document.querySelectorAll('#runs-table tbody tr')).map("
        "r => r.cells[0].innerText + ' ' + r.cells[2].innerText);")


def _query(dash_br) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(
        dash_br.driver.current_url).query))


def test_the_list_sorts_pages_and_filters_on_the_server_and_keeps_it_in_the_url(
        many: Collector, dash_br) -> None:
    dash_br.server_url = many.url + "/?sort=goodput&order=asc"
    assert wait_until(lambda: (_rows(dash_br) or [""])[0] == "r54 3.5%", 30), _rows(dash_br)
    rows = _rows(dash_br)
    assert len(rows) == 50 and rows[-1] == "r05 25.0%"  # 2 / (3 + 5)
    dash_br.wait_for_text_to_equal("#runs-count", "runs 1-50 of 55", timeout=10)
    dash_br.find_element("#runs-next").click()
    assert wait_until(lambda: _rows(dash_br) == ["r04 28.6%", "r03 33.3%", "r02 40.0%",
                                                 "r01 50.0%", "r00 66.7%"], 30), _rows(dash_br)
    dash_br.wait_for_text_to_equal("#runs-count", "runs 51-55 of 55", timeout=10)
    assert wait_until(lambda: _query(dash_br).get("page") == "2", 10)
    shared = dash_br.driver.current_url
    assert _query(dash_br) == {"sort": "goodput", "order": "asc", "page": "2"}
    # the copied link, opened afresh, shows the same page
    dash_br.server_url = many.url + "/"
    # all start at t0: newest first, ties by run id
    assert wait_until(lambda: (_rows(dash_br) or [""])[0].startswith("r00 "), 30)
    dash_br.driver.get(shared)
    assert wait_until(lambda: _rows(dash_br)[:1] == ["r04 28.6%"], 30), _rows(dash_br)
    # a text filter narrows the list on the server and starts again at page 1
    enter_text(dash_br, dash_br.find_element("#runs-q"), "r1")
    assert wait_until(lambda: [r.split()[0] for r in _rows(dash_br)] ==
                      [f"r{i}" for i in range(19, 9, -1)], 30), _rows(dash_br)
    dash_br.wait_for_text_to_equal("#runs-count", "runs 1-10 of 10", timeout=10)
    assert wait_until(lambda: _query(dash_br) == {"sort": "goodput", "order": "asc",
                                                  "q": "r1"}, 10), _query(dash_br)
    logs = [e for e in dash_br.get_logs() if e.get("level") == "SEVERE"]
    assert logs == [], logs
