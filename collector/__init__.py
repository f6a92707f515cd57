"""The collector side: per-rank exporter, ingest validation, the DuckDB store, the single
writer, Prometheus exposition, the HTTP service and trace replay."""
