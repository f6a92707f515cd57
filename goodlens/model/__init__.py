"""The data model, the bottom layer: column specifications, units, event kinds, the wire
batch and the trace format. Imports nothing of goodlens above it; the exporter imports only
``schema``, ``units`` and ``wire`` from here (no numpy, no pandas).
"""
