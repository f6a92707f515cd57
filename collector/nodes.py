"""The node table a collector serves on ``/metrics``: recomputed in the background, read at
scrape time.

Why a module of its own: the node table (:mod:`goodlens.analysis.nodes`) reads every run's
placements, a scan of the raw step rows, far too slow for a scrape. A scrape reads the last
table computed; when it is older than ``every_s`` the scrape starts one recomputation on a
thread of its own (one at a time) and returns the previous table meanwhile. Only hosts with
the verdict ``drain`` become series, at most :data:`MAX_NODE_SERIES` of them (the most
significant), so the series count stays bounded however large the fleet.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from goodlens.analysis.nodes import NodeInputs, NodeTable, node_table
from goodlens.storage import nodeio

log = logging.getLogger("goodlens.nodes")

#: Most hosts exported as ``goodlens_node_*`` series (the ones to drain, most significant
#: first); ``goodlens_nodes_drain_hosts`` counts them all.
MAX_NODE_SERIES = 50


class NodeCache:
    """The latest node table of ``store`` over the last ``window_s`` (None: everything),
    recomputed at most every ``every_s``."""

    def __init__(self, store: Any, every_s: float = 300.0, window_s: float | None = 7 * 86400.0,
                 q: float = 0.05) -> None:
        self.store = store
        self.every_s = every_s
        self.window_s = window_s
        self.q = q
        self.table: NodeTable | None = None
        self.computed_at = 0.0
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def refresh(self, now: float | None = None) -> NodeTable:
        """Recompute the table now (in the calling thread) and keep it."""
        now = time.time() if now is None else now
        since = None if self.window_s is None else now - self.window_s
        frames = nodeio.read_duckdb(self.store)
        t = node_table(NodeInputs(**frames), since=since, until=now, q=self.q)
        with self._lock:
            self.table, self.computed_at = t, now
        return t

    def current(self) -> NodeTable | None:
        """The last table; starts a recomputation in the background when it is stale."""
        with self._lock:
            stale = time.time() - self.computed_at >= self.every_s and not self._busy \
                and not self._closed
            if stale:
                self._busy = True
                self._thread = threading.Thread(target=self._background, name="goodlens-nodes",
                                                daemon=True)
                self._thread.start()
        return self.table

    def close(self, timeout_s: float = 60.0) -> None:
        """Start no more recomputations and wait for the one running (its store is about
        to be closed under it)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _background(self) -> None:
        try:
            self.refresh()
        except Exception:
            log.exception("computing the node table failed")
            with self._lock:
                self.computed_at = time.time()  # try again after every_s, not at once
        finally:
            with self._lock:
                self._busy = False


def drain_rows(t: NodeTable | None) -> list[dict[str, Any]]:
    """The rows ``/metrics`` exports: hosts to drain, most significant first, capped."""
    if t is None:
        return []
    rows = t.rows[t.rows.verdict == "drain"].head(MAX_NODE_SERIES)
    return rows.to_dict("records")
