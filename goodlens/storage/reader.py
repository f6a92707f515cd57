"""The typed read interface: what analysis, detectors, ``/metrics`` and the dashboard read.

Why it exists: those layers compute over frames and must not depend on which store holds
the rows (a DuckDB file, a Parquet dataset, a test double), nor import DuckDB. They annotate
their ``source``/``store`` parameters with :class:`RunReader`; both
:class:`goodlens.storage.store.Store` and :class:`goodlens.storage.parquet.ParquetStore`
implement it (through :class:`goodlens.storage.queries.SqlReader`). This module imports no
database driver, so depending on it keeps a layer free of SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: ``goodlens detect`` reads without pandas
    import numpy as np
    import pandas as pd
    import pyarrow as pa


class RunReader(Protocol):
    """The read API of a goodlens store (documented on
    :class:`goodlens.storage.queries.SqlReader`, which implements it over DuckDB)."""

    def runs(self) -> pd.DataFrame: ...

    def runs_page(self, limit: int | None = None, offset: int = 0, sort: str = "start",
                  descending: bool = True, state: str | None = None,
                  text: str | None = None) -> tuple[pd.DataFrame, int]: ...

    def runs_of(self, run_ids: list[str]) -> pd.DataFrame: ...

    def stored_report(self, run_id: str) -> dict[str, Any] | None: ...

    def stored_reports(self, run_ids: list[str] | None = None, since: float | None = None
                       ) -> list[Any]: ...

    def run(self, run_id: str) -> dict[str, Any] | None: ...

    def run_row(self, run_id: str) -> dict[str, Any] | None: ...

    def attempts(self, run_id: str) -> pd.DataFrame: ...

    def step_summaries(self, run_id: str, attempt: int | None = None,
                       since: float | None = None, until: float | None = None
                       ) -> pd.DataFrame: ...

    def events(self, run_id: str, kinds: list[str] | None = None, since: float | None = None,
               until: float | None = None, attempt: int | None = None) -> pd.DataFrame: ...

    def steps(self, run_id: str, attempt: int | None = None, step_min: int | None = None,
              step_max: int | None = None, ranks: list[int] | None = None
              ) -> pd.DataFrame: ...

    def ready_matrix(self, run_id: str) -> tuple[dict[str, np.ndarray], np.ndarray]: ...

    def step_range(self, run_id: str, attempt: int, since: float | None = None,
                   until: float | None = None) -> tuple[int, int, int] | None: ...

    def heatmap(self, run_id: str, attempt: int, step_min: int, step_max: int,
                rank_bins: int, step_bins: int) -> pd.DataFrame: ...

    def host_compute(self, run_id: str, attempt: int, step_min: int, step_max: int
                     ) -> pd.DataFrame: ...

    def rank_hosts(self, run_id: str, attempt: int | None = None) -> pd.DataFrame: ...

    def rank_host_map(self, run_id: str, attempt: int | None = None
                      ) -> dict[int, str | None]: ...

    def run_metrics(self, window_steps: int = 100, run_ids: list[str] | None = None
                    ) -> pd.DataFrame: ...

    def row_counts(self) -> dict[str, int]: ...

    def table(self, name: str, run_id: str) -> pa.Table: ...
