"""Storage: the DuckDB file and the Parquet dataset behind one typed read interface, their
DDL, and the single writer that feeds them. The only layer with SQL; no statistics.

``reader`` (the :class:`~goodlens.storage.reader.RunReader` protocol other layers read
through), ``schema`` (every table and view), ``queries`` (the reads, as SQL), ``marks``
(idempotent writes), ``summaries`` (per-step summaries), ``segments`` (durable Parquet
files), ``store`` (the DuckDB file), ``parquet`` (the dataset) and ``writer`` (the writer
thread).
"""
