"""Validation of wire batches: every malformed shape is refused with the field named."""

from __future__ import annotations

import orjson
import pytest

from goodlens.model.batch import BatchError, decode_batch
from tests.harness import step_batch


def refuse(doc, field: str | None, status: int = 422) -> BatchError:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    with pytest.raises(BatchError) as info:
        decode_batch(body)
    assert info.value.field == field, info.value.message
    assert info.value.status == status
    return info.value


def test_valid_batch_broadcasts_scalars_and_fills_optional_columns():
    b = decode_batch(orjson.dumps(step_batch("r", 3, [5, 6, 7])))
    assert b.steps.num_rows == 3
    assert b.steps.column("rank").to_pylist() == [3, 3, 3]
    assert b.steps.column("host").to_pylist() == ["node-0"] * 3
    assert b.steps.column("tokens").null_count == 3
    assert b.rows == 3


def test_nulls_allowed_in_optional_numeric_columns():
    doc = step_batch("r", 0, [1, 2])
    doc["steps"]["compute_s"] = [0.5, None]
    b = decode_batch(orjson.dumps(doc))
    assert b.steps.column("compute_s").to_pylist() == [0.5, None]


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["steps"].__setitem__("rank", "three"), "steps.rank"),
    (lambda d: d["steps"].__setitem__("step", [1.5, 2.5]), "steps.step"),
    (lambda d: d["steps"].__setitem__("duration_s", ["1", "2"]), "steps.duration_s"),
    (lambda d: d["steps"].__setitem__("duration_s", [1.0, -2.0]), "steps.duration_s"),
    (lambda d: d["steps"].__setitem__("duration_s", [1.0, None]), "steps.duration_s"),
    (lambda d: d["steps"].__setitem__("step", [[1], [2]]), "steps.step"),
    (lambda d: d["steps"].__setitem__("step", [True, False]), "steps.step"),
    (lambda d: d["steps"].__setitem__("rank", 10**10), "steps.rank"),
    (lambda d: d["steps"].__setitem__("rank", [1, 2**40]), "steps.rank"),
    (lambda d: d.__setitem__("exporter", {"source": "s", "droped_rows": 1}),
     "exporter.droped_rows"),
    (lambda d: d["steps"].pop("start_time"), "steps.start_time"),
    (lambda d: d["steps"].__setitem__("durationz", [1, 2]), "steps.durationz"),
    (lambda d: d["steps"].__setitem__("compute_s", [1.0, 2.0, 3.0]), "steps"),
    (lambda d: d.pop("run_id"), "run_id"),
    (lambda d: d.__setitem__("run_id", ""), "run_id"),
    (lambda d: d.__setitem__("schema_version", 99), "schema_version"),
    (lambda d: d.pop("schema_version"), "schema_version"),
    (lambda d: d.__setitem__("extra", 1), "extra"),
    (lambda d: d.__setitem__("run", {"world_size": "big"}), "run.world_size"),
    (lambda d: d.__setitem__("run", {"colour": "red"}), "run.colour"),
    (lambda d: d.__setitem__("events", {"source": "s", "seq": [0], "kind": ["explode"],
                                        "time": [1.0], "attempt": 0}), "events.kind"),
    (lambda d: d.__setitem__("events", {"source": "s", "seq": [0], "kind": ["heartbeat"],
                                        "attempt": 0}), "events.time"),
])
def test_malformed_batches_name_the_field(mutate, field):
    doc = step_batch("r", 0, [1, 2])
    mutate(doc)
    err = refuse(doc, field)
    assert field.split(".")[-1] in err.message


def test_not_json_and_not_an_object_are_400():
    refuse(b"{not json", None, 400)
    refuse(b"[1, 2]", None, 400)


def test_schema_version_message_says_what_to_upgrade():
    doc = step_batch("r", 0, [1])
    doc["schema_version"] = 2
    assert "upgrade the collector" in refuse(doc, "schema_version").message


# ---------------------------------------------------------------- Arrow IPC wire batches
def arrow_body(columns: dict | None = None, meta: dict | None = None) -> bytes:
    import pyarrow as pa

    from goodlens.model.wire import META_KEY
    table = pa.table(columns if columns is not None else {
        "attempt": [0, 0], "rank": [1, 1], "step": [5, 6], "start_time": [1.0, 2.0],
        "duration_s": [1.0, 1.0]})
    table = table.replace_schema_metadata(
        {META_KEY: orjson.dumps(meta if meta is not None else {"schema_version": 1,
                                                               "run_id": "r"})})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_arrow_and_json_batches_decode_to_the_same_tables():
    from goodlens.model.batch_arrow import decode_arrow_batch
    from goodlens.model.wire import encode_arrow_batch
    doc = step_batch("r", 3, list(range(50)))
    doc["events"] = {"source": "s", "seq": [0, 1], "kind": ["heartbeat", "init_start"],
                     "time": [1.0, 2.0], "attempt": 0}
    doc["run"] = {"world_size": 8}
    a = decode_arrow_batch(encode_arrow_batch(doc))
    j = decode_batch(orjson.dumps(doc))
    assert a.steps.equals(j.steps) and a.events.equals(j.events) and a.run == j.run


@pytest.mark.parametrize("body, field, status", [
    (b"not arrow at all", None, 400),
    (arrow_body(meta={"run_id": "r"}), "schema_version", 422),
    (arrow_body({"attempt": [0], "rank": [1], "step": [5], "start_time": [1.0],
                 "duration_s": [1.0], "durration": [2.0]}), "steps.durration", 422),
    (arrow_body({"attempt": [0], "rank": ["one"], "step": [5], "start_time": [1.0],
                 "duration_s": [1.0]}), "steps.rank", 422),
    (arrow_body({"attempt": [0], "rank": [1], "step": [5], "start_time": [1.0],
                 "duration_s": [-1.0]}), "steps.duration_s", 422),
    (arrow_body({"attempt": [0], "rank": [1], "step": [5], "start_time": [float("nan")],
                 "duration_s": [1.0]}), "steps.start_time", 422),
    (arrow_body({"attempt": [0], "rank": [None], "step": [5], "start_time": [1.0],
                 "duration_s": [1.0]}), "steps.rank", 422),
    (arrow_body({"attempt": [0], "rank": [1], "start_time": [1.0], "duration_s": [1.0]}),
     "steps.step", 422),
    (arrow_body({"attempt": [0], "rank": [2**25], "step": [5], "start_time": [1.0],
                 "duration_s": [1.0]}), "steps.rank", 422),
    (arrow_body({"attempt": [0], "rank": [1], "step": __import__("pyarrow").array(
        [2**63 + 5], __import__("pyarrow").uint64()), "start_time": [1.0],
                 "duration_s": [1.0]}), "steps.step", 422),
])
def test_malformed_arrow_batches_name_the_field(body, field, status):
    from goodlens.model.batch_arrow import decode_arrow_batch
    with pytest.raises(BatchError) as info:
        decode_arrow_batch(body)
    assert (info.value.field, info.value.status) == (field, status), info.value.message


def test_arrow_metadata_must_be_present():
    import pyarrow as pa

    from goodlens.model.batch_arrow import decode_arrow_batch
    sink = pa.BufferOutputStream()
    t = pa.table({"step": [1]})
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    with pytest.raises(BatchError, match="metadata"):
        decode_arrow_batch(sink.getvalue().to_pybytes())


def test_arrow_duplicate_columns_are_refused():
    import pyarrow as pa

    from goodlens.model.batch_arrow import decode_arrow_batch
    from goodlens.model.wire import META_KEY
    t = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["step", "step"])
    t = t.replace_schema_metadata({META_KEY: b'{"schema_version": 1, "run_id": "r"}'})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    with pytest.raises(BatchError, match="more than once") as info:
        decode_arrow_batch(sink.getvalue().to_pybytes())
    assert info.value.field == "steps.step"
