"""Storage: the DuckDB file and the Parquet dataset behind one typed read interface, their
DDL, and the single writer that feeds them. The only layer with SQL; no statistics.
"""
