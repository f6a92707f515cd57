"""When a page redraws, and whether the browser keeps the user's view (``app.redraw``).

The case it decides: a timer tick's request can supersede a control's (the browser drops
the control's answer), and a tick that finds other controls than the ones shown must draw
afresh; kept as a timer redraw, the axes stay those drawn for the old controls (a zoomed
window shown everywhere but the timeline). Keys here are written out by hand:
``[version, controls]``.
"""

from __future__ import annotations

from goodlens.dashboard.app import redraw

V1, V2 = [7, 120.5], [8, 130.0]
WHOLE = [[], "", ""]                      # exclude, since, until: no window
ZOOMED = [[], "2026-01-01T00:29:55", "2026-01-01T00:59:45"]


def test_a_tick_with_nothing_moved_draws_nothing() -> None:
    assert redraw([V1, WHOLE], [V1, WHOLE], tick=True) is None


def test_a_tick_after_new_data_keeps_the_users_view() -> None:
    assert redraw([V2, WHOLE], [V1, WHOLE], tick=True) is True


def test_a_tick_that_carries_a_new_window_draws_afresh() -> None:
    # the window's own answer was dropped: this tick draws the window, not the old axes
    assert redraw([V1, ZOOMED], [V1, WHOLE], tick=True) is False
    assert redraw([V2, ZOOMED], [V1, WHOLE], tick=True) is False


def test_a_control_draws_afresh_even_when_nothing_moved() -> None:
    assert redraw([V1, ZOOMED], [V1, WHOLE], tick=False) is False
    assert redraw([V1, WHOLE], [V1, WHOLE], tick=False) is False  # the page opened again


def test_nothing_shown_yet_draws_afresh() -> None:
    assert redraw([V1, WHOLE], None, tick=True) is False
    assert redraw([V1, WHOLE], None, tick=False) is False


def test_the_ranks_pages_key_compares_its_controls_not_its_findings_flag() -> None:
    shown = [V1, ["latest", "max", "latest", "", ""], False]
    assert redraw([V1, ["latest", "max", "latest", "", ""], True], shown, tick=True) is True
    assert redraw([V1, ["latest", "max", "all", "", ""], False], shown, tick=True) is False


def test_a_key_of_the_old_layout_draws_afresh() -> None:
    # a page open across an upgrade holds a flat key: drawn afresh, never kept
    assert redraw([V1, WHOLE], [7, 120.5, [], "", ""], tick=True) is False
