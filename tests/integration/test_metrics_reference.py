"""docs/metrics.md lists exactly the series the collector exports, with their types and
labels: a collector over the demo run with its straggler finding open, scraped in-process."""

from __future__ import annotations

import re
from pathlib import Path

from goodlens.collector.detection import DetectionService
from goodlens.collector.metrics import make_registry
from goodlens.collector.nodes import NodeCache
from goodlens.collector.replay import import_trace
from goodlens.storage.store import Store
from goodlens.storage.writer import Writer
from tests.harness import ROOT

_ROW = re.compile(r"^\| `(goodlens_[a-z_]+)` \| (\w+) \|([^|]*)\|")


def _documented() -> dict[str, tuple[str, set[str]]]:
    out = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = _ROW.match(line)
        if m:
            out[m[1]] = (m[2], set(re.findall(r"`(\w+)`", m[3])))
    return out


def test_the_metrics_page_lists_every_exported_series(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    import_trace(store, ROOT / "sample_data" / "demo")
    import_trace(store, ROOT / "tests" / "fixtures" / "runs" / "torchft")  # the ft series
    writer = Writer(store).start()
    try:
        svc = DetectionService(store, writer)
        svc.poll_once()  # rank 5's finding: the straggler series exist
        assert svc.flagged()["demo-8x"]
        exported = {}
        nodes = NodeCache(store)
        nodes.refresh()  # the node series (none flagged in the demo: the count only)
        for family in make_registry(store, writer, svc, nodes=nodes).collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = {k for s in family.samples for k in s.labels}
            exported[name] = (family.type, labels)
    finally:
        writer.stop()
        store.close()
    documented = _documented()
    assert set(documented) == set(exported), (
        f"exported, not in docs/metrics.md: {sorted(set(exported) - set(documented))}; "
        f"documented, not exported: {sorted(set(documented) - set(exported))}")
    for name, (kind, labels) in exported.items():
        doc_kind, doc_labels = documented[name]
        assert doc_kind == kind, name
        # a label shows only on series that exist (the hang timeout: while a run runs)
        assert labels <= doc_labels, (name, labels, doc_labels)
