"""Spark SQL as the summarising engine of a Parquet dataset too big for one machine.

Why a module of its own: past one machine goodlens uses an existing engine rather than
growing its own. Spark reads the dataset's step segments and runs the *same* summarising
SQL as DuckDB does (:func:`goodlens.storage.schema.summary_select` and
:func:`~goodlens.storage.schema.deduplicated` in the Spark :data:`~goodlens.storage.schema.SPARK`
dialect), so the two cannot drift; what to read and where the result goes is
:mod:`goodlens.storage.bulk`'s job. ``pyspark`` is an optional extra (``goodlens[spark]``)
imported only inside these functions, so ``pip install goodlens`` pulls in no Spark and no
other command loads it. Nothing is downloaded at run time (no ``spark.jars.packages``):
Parquet support ships with Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goodlens.model.schema import STEP_COLUMNS
from goodlens.storage import ckptfiles, passguard
from goodlens.storage.schema import (
    BOX_COLUMNS,
    SPARK,
    STEP_NAMES,
    deduplicated,
    in_boxes,
    summary_select,
)

if TYPE_CHECKING:  # annotations only: pyspark is imported when Spark is used
    import pyarrow as pa
    from pyspark.sql import SparkSession

#: Settings of a session goodlens starts: no web UI nor progress bars, times in UTC.
BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
#: Local mode binds to loopback only (nothing leaves the machine) and lists the segments on
#: the driver: on one machine a listing job's tasks cost more than the file status calls
#: they would spread, so the threshold keeps the listing in the driver.
LOCAL_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
              "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000"}


class SparkUnavailable(RuntimeError):
    """pyspark is not installed, or Spark cannot start (no Java runtime)."""


@contextmanager
def spark_session(master: str | None = None, conf: dict[str, str] | None = None,
                  log_level: str = "ERROR") -> Iterator[SparkSession]:
    """A Spark session: the one already running in this process (a notebook's, a test's;
    left running), else a new one on ``master`` (default ``local[*]``: every core of this
    machine) with :data:`BASE_CONF` and ``conf``, logging at ``log_level``, stopped on
    exit."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable("the Spark engine needs pyspark: pip install 'goodlens[spark]'"
                               ) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    master = master or "local[*]"
    builder = SparkSession.builder.master(master).appName("goodlens")
    settings = {**BASE_CONF, **(LOCAL_CONF if master.startswith("local") else {}),
                **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # pyspark raises its own runtime errors (no JVM, bad master)
        raise SparkUnavailable(f"Spark did not start on {master}: {passguard.first_line(exc)}; it "
                               "needs a Java runtime 17+ (Debian: apt-get install "
                               "default-jre-headless)") from None
    spark.sparkContext.setLogLevel(log_level)
    try:
        yield spark
    finally:
        spark.stop()


def engine(spark: SparkSession, root: Path) -> Callable[[list[str], list[tuple] | None],
                                                          pa.Table]:
    """The Spark engine of a batch pass (:func:`goodlens.storage.bulk.summarize_dataset`)
    over the dataset at ``root``: :func:`summaries` on ``spark``."""
    return lambda files, boxes: summaries(spark, root, files, boxes)


def summaries(spark: SparkSession, root: Path, files: list[str],
              boxes: list[tuple] | None = None) -> pa.Table:
    """The per-step summaries of the step rows in the segments ``files`` of the dataset at
    ``root``, each key counted once; with ``boxes`` (``run_id``, first and last attempt,
    first and last step), only of the rows inside one of them. As an Arrow table with the
    summary columns, collected to the driver (one row per step: small beside the rows)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    _raw_steps(spark, root, files).createOrReplaceTempView("goodlens_raw_steps")
    source = "goodlens_raw_steps"
    if boxes:
        schema = StructType([StructField(c, StringType() if c == "run_id" else LongType())
                             for c in BOX_COLUMNS])
        spark.createDataFrame(boxes, schema).createOrReplaceTempView("goodlens_boxes")
        source = in_boxes(source, "goodlens_boxes")
    # one shuffle, by step: it also serves the key's window (a superset of these columns)
    # and the aggregate, which then merges no partial medians (measured: twice as fast as
    # Spark's own plan of two shuffles). A physical hint only: the rows are the same.
    source = f"(SELECT * FROM {source} DISTRIBUTE BY run_id, attempt, step)"
    query = summary_select(f"({deduplicated('steps', source, SPARK)}) AS steps",
                           dialect=SPARK)
    return spark.sql(query).toArrow()


def _raw_steps(spark: SparkSession, root: Path, files: list[str]) -> Any:
    """The step rows of ``files`` with their run id. Spark's partition discovery decodes
    the run folder names of today's encoding as goodlens does; a folder it would decode
    otherwise (an earlier goodlens's percent-encoded UTF-8, a name Spark reads as null) is
    read on its own, with the run id goodlens decodes from its name."""
    from pyspark.sql import functions as F

    plain, odd = [], {}
    for f in files:
        folder = Path(f).parent.parent.name
        run = ckptfiles.run_of_key(folder)
        if passguard.spark_reads(folder.split("=", 1)[1]) == run:
            plain.append(f)
        else:
            odd.setdefault(run, []).append(f)
    # a listed segment that a compaction removed meanwhile is skipped: its rows are in the
    # merged segment, read now or (not in the new checkpoint's list) by the next pass
    frames = []
    if plain:
        frames.append(spark.read.schema(_step_schema(("run_id", "hour")))
                      .option("basePath", str(root / "steps"))
                      .option("ignoreMissingFiles", "true").parquet(*plain))
    for run, paths in sorted(odd.items()):
        frames.append(spark.read.schema(_step_schema(("hour",)))
                      .option("basePath", str(Path(paths[0]).parent.parent))
                      .option("ignoreMissingFiles", "true").parquet(*paths)
                      .withColumn("run_id", F.lit(run)))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _step_schema(partitions: tuple[str, ...]) -> Any:
    """The step segments' columns as Spark types (the model's), plus the partition columns
    read from the folder names as text (a run id of digits stays a string: given a schema,
    Spark infers no partition types)."""
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    kinds = {"int": LongType(), "float": DoubleType(), "str": StringType()}
    by_name = {c.name: kinds[c.kind] for c in STEP_COLUMNS}
    return StructType([StructField(n, by_name[n]) for n in STEP_NAMES]
                      + [StructField(p, StringType()) for p in partitions])

