"""The Dash app: where the wall-clock went, which ranks are slow, what checkpoints cost.

``create_app(store, config)`` lands with the dashboard issue; the collector already serves
the data it will read (``collector.store.Store``'s read API).
"""
