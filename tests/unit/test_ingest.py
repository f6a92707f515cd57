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


# ------------------------------------------------- value ranges, overflow, limits (hostile)
def _doc(**steps) -> dict:
    doc = step_batch("r", 0, [1, 2])
    doc["steps"].update(steps)
    return doc


@pytest.mark.parametrize("doc, field, words", [
    (_doc(rank=2**63), "steps.rank", "64 bits"),
    (_doc(step=2**64 - 1), "steps.step", "64 bits"),
    (_doc(step=[2**63, None]), "steps.step", "beyond 64 bits"),
    (_doc(step=[2**64 - 1, 1]), "steps.step", "too large for a 64-bit integer"),
    (_doc(tokens=[1, 2**63]), "steps.tokens", "64-bit"),
    (_doc(start_time=-1e15), "steps.start_time", "must not be negative"),
    (_doc(start_time=[1000.0, 4.2e9]), "steps.start_time", "at most 4102444800"),
    (_doc(start_time=1.7e12), "steps.start_time", "not milliseconds"),
    (_doc(duration_s=1e300), "steps.duration_s", "at most 86400"),
    (_doc(duration_s=[1.0, 86_401.0]), "steps.duration_s", "at most 86400"),
    (_doc(data_wait_s=[1.0, -0.5]), "steps.data_wait_s", "negative"),
    (_doc(compute_s=[1.0, 2**63]), "steps.compute_s", "at most 86400"),
    (_doc(host="x" * 4097), "steps.host", "at most 4096 bytes"),
    (_doc(host=["é" * 2049, "a"]), "steps.host", "at most 4096 bytes"),
    ({**_doc(), "run": {"world_size": 2**63}}, "run.world_size", "64 bits"),
    ({**_doc(), "run": {"world_size": 2**24 + 2}}, "run.world_size", "at most 16777216"),
    ({**_doc(), "run": {"gpus_per_rank": 5000}}, "run.gpus_per_rank", "at most 1024"),
    ({**_doc(), "run": {"model_params": -1}}, "run.model_params", "negative"),
    ({**_doc(), "run": {"tags": {"k": "v" * 70_000}}}, "run.tags", "at most 65536 bytes"),
    ({**_doc(), "exporter": {"source": "s", "dropped_rows": 2**64 - 1}},
     "exporter.dropped_rows", "between 0 and"),
    ({**_doc(), "exporter": {"source": "s" * 300}}, "exporter.source", "at most 256"),
    ({**_doc(), "events": {"source": "s", "seq": [0], "kind": ["world_resized"],
                           "time": [1000.0], "attempt": 0, "world_size": [2**40]}},
     "events.world_size", "at most 16777216"),
    ({**_doc(), "events": {"source": "s", "seq": [0], "kind": ["heartbeat"],
                           "time": [-5.0], "attempt": 0}}, "events.time", "negative"),
])
def test_values_outside_their_columns_range_are_422_naming_the_field(doc, field, words):
    err = refuse(doc, field)
    assert words in err.message, err.message
    assert err.reason == "invalid"


def test_json_beyond_64_bits_is_422_and_non_finite_json_is_400():
    body = orjson.dumps(step_batch("r", 0, [1])).replace(b'"rank":0',
                                                         b'"rank":18446744073709551616')
    assert "64 bits" in refuse(body, "steps.rank").message
    refuse(b'{"schema_version": 1, "run_id": "r", "steps": {"duration_s": NaN}}', None, 400)


def test_limits_narrow_the_window_of_instants_and_durations():
    from goodlens.model.batch import Limits
    limits = Limits(min_epoch_s=946_684_800, max_duration_s=60)
    with pytest.raises(BatchError, match="at least 946684800") as info:
        decode_batch(orjson.dumps(step_batch("r", 0, [1])), limits)
    assert info.value.field == "steps.start_time"
    doc = step_batch("r", 0, [1])
    doc["steps"]["start_time"] = 1_767_225_600.0
    doc["steps"]["duration_s"] = 61.0
    with pytest.raises(BatchError, match="at most 60") as info:
        decode_batch(orjson.dumps(doc), limits)
    assert info.value.field == "steps.duration_s"


def test_rows_and_json_values_beyond_the_limits_are_413():
    from goodlens.model.batch import Limits
    doc = step_batch("r", 0, list(range(11)))
    with pytest.raises(BatchError, match="more than the 10 a push may hold") as info:
        decode_batch(orjson.dumps(doc), Limits(max_rows=10))
    assert (info.value.status, info.value.reason) == (413, "decoded_too_large")
    with pytest.raises(BatchError, match="JSON values") as info:
        decode_batch(orjson.dumps(doc), Limits(max_decoded_bytes=1000))
    assert info.value.status == 413


def _ipc(table, compression=None) -> bytes:
    import pyarrow as pa

    from goodlens.model.wire import META_KEY
    table = table.replace_schema_metadata({META_KEY: b'{"schema_version": 1, "run_id": "r"}'})
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _steps(n: int, **extra):
    import numpy as np
    import pyarrow as pa
    z = pa.array(np.zeros(n, dtype=np.int8))
    return pa.table({"attempt": z, "rank": z, "step": pa.array(np.arange(n)),
                     "start_time": pa.array(np.full(n, 1000.0)), "duration_s": z, **extra})


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_arrow_rows_and_decompressed_bytes_are_bounded_before_decoding(compression):
    from goodlens.model.batch import Limits
    from goodlens.model.batch_arrow import decode_arrow_batch
    body = _ipc(_steps(3_000), compression)
    assert decode_arrow_batch(body).steps.num_rows == 3_000
    with pytest.raises(BatchError, match="more than 2000 rows") as info:
        decode_arrow_batch(body, Limits(max_rows=2_000))
    assert info.value.status == 413
    with pytest.raises(BatchError, match="expands to more than 10000 bytes") as info:
        decode_arrow_batch(body, Limits(max_decoded_bytes=10_000))
    assert info.value.status == 413


def test_a_dictionary_bomb_is_413_and_a_small_dictionary_is_fine():
    import numpy as np
    import pyarrow as pa

    from goodlens.model.batch import Limits
    from goodlens.model.batch_arrow import decode_arrow_batch
    n = 1_000
    idx = pa.array(np.zeros(n, dtype=np.int8))
    ok = _steps(n, host=pa.DictionaryArray.from_arrays(idx, pa.array(["node-1"])))
    assert decode_arrow_batch(_ipc(ok)).steps.column("host")[0].as_py() == "node-1"
    bomb = _steps(n, host=pa.DictionaryArray.from_arrays(idx, pa.array(["x" * 4000])))
    with pytest.raises(BatchError, match="dictionary-encoded") as info:
        decode_arrow_batch(_ipc(bomb, "zstd"), Limits(max_decoded_bytes=1_000_000))
    assert (info.value.status, info.value.field) == (413, "steps.host")


def test_arrow_strings_with_invalid_utf8_or_offsets_are_422_naming_the_column():
    import numpy as np
    import pyarrow as pa

    from goodlens.model.batch_arrow import decode_arrow_batch
    body = _ipc(_steps(2, host=pa.array(["QZQZ", "QZQZ"])))
    bad = body.replace(b"QZQZQZQZ", b"\xff\xfeQZ\xc0QZQ")
    with pytest.raises(BatchError, match="UTF8") as info:
        decode_arrow_batch(bad)
    assert (info.value.status, info.value.field) == (422, "steps.host")
    offsets = np.array([0, 4, 8], dtype=np.int32).tobytes()
    bad = body.replace(offsets, np.array([0, 400, 8], dtype=np.int32).tobytes())
    with pytest.raises(BatchError) as info:
        decode_arrow_batch(bad)
    assert info.value.status in (400, 422) and "host" in (info.value.field or "steps.host")


def test_arrow_uint64_beside_a_null_and_too_many_columns_are_refused():
    import numpy as np
    import pyarrow as pa

    from goodlens.model.batch_arrow import decode_arrow_batch
    t = _steps(2, tokens=pa.array([None, 2**64 - 1], pa.uint64()))
    with pytest.raises(BatchError, match="tokens") as info:
        decode_arrow_batch(_ipc(t))
    assert (info.value.status, info.value.field) == (422, "steps.tokens")
    wide = _steps(1, **{f"c{k}": pa.array(np.ones(1)) for k in range(70)})
    with pytest.raises(BatchError, match="more than 64 columns"):
        decode_arrow_batch(_ipc(wide))


def test_truncated_arrow_and_unexpected_errors_are_4xx_never_another_exception():
    from goodlens.model.batch import refusing
    from goodlens.model.batch_arrow import decode_arrow_batch
    body = _ipc(_steps(5, host=__import__("pyarrow").array(["a"] * 5)), "zstd")
    for cut in range(0, len(body), 7):
        with pytest.raises(BatchError) as info:
            decode_arrow_batch(body[:cut])
        assert 400 <= info.value.status < 500

    @refusing
    def explodes(body: bytes):
        raise KeyError("surprise")
    with pytest.raises(BatchError, match="KeyError") as info:
        explodes(b"")
    assert info.value.status == 400
