"""The dashboard in a real headless Chromium, served by a real collector process.

What must hold: the headline goodput and every bucket on the overview equal
``/v1/report`` (what ``goodlens report --json`` prints) for that run; every page of every
sample run renders with no browser console error; a what-if control changes the result;
a live run's overview refreshes as data arrives; the token gate keeps the dashboard closed.
"""

from __future__ import annotations

import datetime
import time
import urllib.parse
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.harness import ROOT, Collector, enter_text, http, push_steps, wait_until

pytestmark = pytest.mark.slow
SAMPLES = ["sim-64", "demo"]


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("dash") / "store.duckdb"
    loads = [a for s in SAMPLES for a in ("--load", str(ROOT / "sample_data" / s))]
    c = Collector(db, "--no-detect", *loads).start(timeout=120)
    yield c
    c.stop()


def _attr(dash_br, css: str, name: str = "title") -> str | None:
    """One attribute of the element ``css`` read in a single script call: a live page
    replaces elements as it redraws, so a handle found before the read can go stale."""
    return dash_br.driver.execute_script(
        "var e=document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) "
        ": null;", css, name)


def _no_console_errors(dash_br) -> None:
    logs = [e for e in dash_br.get_logs() if e.get("level") == "SEVERE"]
    assert logs == [], f"browser console errors: {logs}"


def test_overview_numbers_equal_the_report(loaded: Collector, dash_br) -> None:
    status, rep = http("GET", loaded.url + "/v1/report?run=sim-64")
    assert status == 200
    dash_br.server_url = loaded.url + "/runs/sim-64"
    dash_br.wait_for_text_to_equal("#headline-goodput", pct(rep["goodput"]), timeout=30)
    assert dash_br.find_element("#headline-goodput").get_attribute("title") == \
        f"{rep['goodput']:.6f}"
    assert dash_br.find_element("#headline-gpu-goodput").text == pct(rep["gpu_time_goodput"])
    wall = rep["wall_clock_s"]
    shown = 0.0
    for bucket, seconds in rep["buckets"].items():
        cell = dash_br.find_element(f"#bucket-{bucket}")
        assert cell.get_attribute("title") == f"{seconds:.2f} s", bucket
        share = dash_br.find_element(f"#bucket-{bucket}-share").text
        assert share == pct(seconds / wall), bucket
        shown += float(cell.get_attribute("title").split()[0])
    assert shown == pytest.approx(wall, abs=0.05)  # the page's buckets sum to wall-clock
    for part, seconds in rep["restart_parts"].items():
        if seconds:
            title = dash_br.find_element(f"#restart-{part}").get_attribute("title")
            assert title == f"{seconds:.2f} s"
    _no_console_errors(dash_br)


def test_an_exclusion_on_the_overview_equals_the_report_with_it(loaded: Collector,
                                                                  dash_br) -> None:
    """Ticking ``queue`` in the overview's exclusion checklist (a real click) shows the
    numbers ``/v1/report?exclude=queue`` gives; unticking it brings the plain ones back."""
    _, plain = http("GET", loaded.url + "/v1/report?run=sim-64")
    _, rep = http("GET", loaded.url + "/v1/report?run=sim-64&exclude=queue")
    assert rep["excluded"]["queue"] > 0 and rep["goodput"] > plain["goodput"]
    dash_br.server_url = loaded.url + "/runs/sim-64"
    dash_br.wait_for_element("#overview-exclude input[value='queue']", timeout=30)
    dash_br.find_element("#overview-exclude input[value='queue']").click()
    assert wait_until(lambda: _attr(dash_br, "#headline-goodput") == f"{rep['goodput']:.6f}")
    assert _attr(dash_br, "#headline-wall") == f"{rep['wall_clock_s']:.2f} s"
    assert _attr(dash_br, "#bucket-restart") == f"{rep['buckets']['restart']:.2f} s"
    assert dash_br.find_element("#headline-excluded").text
    dash_br.find_element("#overview-exclude input[value='queue']").click()
    assert wait_until(lambda: _attr(dash_br, "#headline-goodput") ==
                      f"{plain['goodput']:.6f}")
    _no_console_errors(dash_br)


@pytest.mark.parametrize("run", ["sim-64", "demo-8x"])
def test_every_page_renders_without_console_errors(loaded: Collector, dash_br, run: str
                                                   ) -> None:
    q = urllib.parse.quote(run, safe="")
    pages = {"": "#runs-table", f"runs/{q}": "#timeline-graph .main-svg",
             f"runs/{q}/ranks": "#heatmap-graph .main-svg",
             f"runs/{q}/checkpoints": "#ckpt-graph .main-svg",
             f"runs/{q}/whatif": "#whatif-graph .main-svg",
             "cluster": "#cluster-graph .main-svg"}
    for path, selector in pages.items():
        dash_br.server_url = f"{loaded.url}/{path}"
        dash_br.wait_for_element(selector, timeout=60)
        _no_console_errors(dash_br)
    # the runs list links every sample run
    dash_br.server_url = loaded.url + "/"
    dash_br.wait_for_element("#runs-table", timeout=30)
    links = {a.text for a in dash_br.driver.find_elements(By.CSS_SELECTOR, "#runs-table a")}
    assert {"sim-64", "demo-8x"} <= links


def test_unknown_run_says_so(loaded: Collector, dash_br) -> None:
    dash_br.server_url = loaded.url + "/runs/no-such-run/ranks"
    dash_br.wait_for_contains_text("#not-found", "no run 'no-such-run'", timeout=30)
    _no_console_errors(dash_br)


def test_whatif_control_updates_the_result(loaded: Collector, dash_br) -> None:
    dash_br.server_url = loaded.url + "/runs/sim-64/whatif"
    dash_br.wait_for_element("#whatif-summary", timeout=60)
    first = dash_br.find_element("#whatif-summary")
    assert float(first.get_attribute("title")) == 0.0  # nothing changed yet
    before = first.text
    box = dash_br.find_element("#whatif-interval")
    from goodlens.model.units import parse_duration
    current = parse_duration(box.get_attribute("value"))  # shown as a duration: 11m 04s
    enter_text(dash_br, box, f"{current / 5:.0f}s")  # the planner says much shorter is better here
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = dash_br.driver.execute_script(
            "var e=document.querySelector('#whatif-summary'); return e ? e.textContent : null;")
        if text not in (before, None) and float(_attr(dash_br, "#whatif-summary") or 0) != 0.0:
            break
        time.sleep(0.3)
    delta = float(_attr(dash_br, "#whatif-summary"))
    assert delta > 0.5, "a 5x shorter interval on this run should gain goodput points"
    # a value the simulator refuses gets an explanation, not a stack trace
    enter_text(dash_br, dash_br.find_element("#whatif-interval"), "0")
    dash_br.wait_for_contains_text("#whatif-error", "at least 6s", timeout=30)
    _no_console_errors(dash_br)


def test_live_run_refreshes(tmp_path: Path, dash_br) -> None:
    c = Collector(tmp_path / "live.duckdb", "--no-detect").start()
    try:
        push_steps(c, "live", list(range(0, 20)))
        dash_br.server_url = c.url + "/runs/live"
        dash_br.wait_for_element("#headline-wall", timeout=30)
        first = _attr(dash_br, "#headline-wall")
        push_steps(c, "live", list(range(20, 60)))
        wait_until(lambda: _attr(dash_br, "#headline-wall") not in (first, None))
        later = _attr(dash_br, "#headline-wall")
        assert float(later.split()[0]) > float(first.split()[0]), "the page did not refresh"
        _no_console_errors(dash_br)
    finally:
        c.stop()


def test_a_live_redraw_keeps_the_users_zoom(tmp_path: Path, dash_br) -> None:
    """Zoom (a real mouse drag) on the rolling-goodput graph of a live run and hide a trace
    from its legend (a real click), let new data redraw the page: the graph shows the new
    data, the same x range and the same hidden trace. (Under Dash 4 ``uirevision`` alone
    lost the zoom at every redraw.)"""
    from selenium.webdriver.common.action_chains import ActionChains
    c = Collector(tmp_path / "zoom.duckdb", "--no-detect").start()
    try:
        push_steps(c, "live", list(range(0, 60)))
        dash_br.server_url = c.url + "/runs/live"
        dash_br.wait_for_element("#series-graph .nsewdrag", timeout=30)
        js = "var g=document.querySelector('#series-graph .js-plotly-plot');"
        # the graph is mounted empty and gets its figure from the first refresh
        assert wait_until(lambda: dash_br.driver.execute_script(
            js + "return !!(g && g.data && g.data.length && g.data[0].x)"))
        view = ("return [g.layout.xaxis.range, g.layout.yaxis.range, "
                "g.data[0].x[g.data[0].x.length-1]]")
        auto = dash_br.driver.execute_script(js + view)
        drag = dash_br.find_element("#series-graph .nsewdrag")
        w, h = drag.size["width"], drag.size["height"]
        ActionChains(dash_br.driver).move_to_element_with_offset(drag, w // 4, h // 2) \
            .click_and_hold().move_by_offset(w // 8, 0).move_by_offset(w // 8, 0) \
            .release().perform()
        assert wait_until(lambda: dash_br.driver.execute_script(js + view)[0] != auto[0])
        # the zoom also sets the page's window (?since=&until=, to the second): wait for
        # the page drawn for it, whose axis is that window
        assert wait_until(lambda: "until=" in dash_br.driver.current_url)
        until = urllib.parse.parse_qs(urllib.parse.urlsplit(
            dash_br.driver.current_url).query)["until"][0]
        end = datetime.datetime.fromisoformat(until).replace(tzinfo=datetime.UTC).timestamp()
        assert wait_until(lambda: _attr(dash_br, "#headline-window").split()[1] ==
                          f"{end:.3f}")
        zoomed = dash_br.driver.execute_script(js + view)
        # hide a bucket from the legend (a real click on its first legend entry)
        dash_br.find_element("#series-graph .legend .traces .legendtoggle").click()
        hidden = js + "return g.data.filter(t => t.visible === 'legendonly').map(t => t.name)"
        assert wait_until(lambda: len(dash_br.driver.execute_script(hidden)) == 1)
        gone = dash_br.driver.execute_script(hidden)  # the top legend entry: stacked last
        push_steps(c, "live", list(range(60, 120)))
        assert wait_until(lambda: dash_br.driver.execute_script(js + view)[2] != zoomed[2]), \
            "the graph did not get the new data"
        time.sleep(1.5)  # a later tick (the version did not move) must not reset it either
        after = dash_br.driver.execute_script(js + view)
        assert after[0] == zoomed[0], f"zoom lost: {zoomed[0]} -> {after[0]}"
        assert after[1] == [0, 100]
        assert dash_br.driver.execute_script(hidden) == gone, "legend choice lost"
        _no_console_errors(dash_br)
    finally:
        c.stop()


def test_token_gate(tmp_path: Path) -> None:
    c = Collector(tmp_path / "t.duckdb", "--token", "s3cret").start()
    try:
        status, body = http("GET", c.url + "/")
        assert status == 401 and "?token=" in body
        assert http("GET", c.url + "/runs/x", headers={"Cookie": "goodlens_token=wrong"})[0] \
            == 401
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):
                return None
        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(c.url + "/?token=s3cret", timeout=10)
            raise AssertionError("expected a redirect")
        except urllib.error.HTTPError as exc:
            assert exc.code == 303
            cookie = exc.headers["set-cookie"]
        assert "goodlens_token=s3cret" in cookie and "HttpOnly" in cookie
        status, body = http("GET", c.url + "/", headers={"Cookie": "goodlens_token=s3cret"})
        assert status == 200 and "_dash-config" in body
        # the API keeps its own bearer token
        assert http("GET", c.url + "/v1/runs")[0] == 401
    finally:
        c.stop()


def test_cluster_page_compares_two_policy_sets(loaded: Collector, dash_br) -> None:
    dash_br.server_url = loaded.url + "/cluster"
    dash_br.wait_for_element("#cluster-metrics", timeout=60)
    head = dash_br.find_element("#cluster-metrics thead").text
    assert "B: gang,topo,ckpt-preempt,fair,spares=8" in head
    # untick B's topology-aware placement: the comparison is recomputed for the new set
    box = dash_br.driver.find_elements(By.CSS_SELECTOR, "#cluster-b-levers input")[1]
    box.click()
    dash_br.wait_for_contains_text("#cluster-metrics thead",
                                   "B: gang,random,ckpt-preempt,fair,spares=8", timeout=60)
    _no_console_errors(dash_br)
