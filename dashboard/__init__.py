"""The Dash app: where the wall-clock went, which ranks are slow, what checkpoints cost.

``create_app(store, config)`` builds it over a store's read API
(:class:`goodlens.storage.reader.RunReader`).
The collector serves it at ``/`` from its own process (``goodlens serve``: one process owns
the DuckDB file); ``goodlens dashboard --db FILE`` serves it alone over a file no collector
holds, read-only. Layout: ``data`` (what a page shows, cached per run version), ``figures``
(pure Plotly builders), ``pages`` (layouts), ``app`` (routing and thin callbacks), ``asgi``
(mounting under Starlette).
"""

from goodlens.dashboard.app import create_app
from goodlens.dashboard.data import DashConfig

__all__ = ["DashConfig", "create_app"]
