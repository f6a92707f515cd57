"""The per-host relay: one pusher per host carries its local ranks' batches to the collector.

A 100,000-GPU job has 100,000 exporters, each with its own connection to the collector and
its own small pushes. Run one relay per host (``goodlens relay``, or let the exporters start
it with ``GOODLENS_RELAY=1``) and the collector sees one keep-alive connection per host
instead of one per GPU, and pushes carrying every local rank's rows at once.

The relay accepts the collector's ``POST /v1/ingest`` bodies (JSON or Arrow IPC) and
validates each with the collector's own decoders (:mod:`goodlens.model.batch`,
:mod:`goodlens.model.batch_arrow`), so an invalid push gets the collector's 4xx naming the
field and never joins a merged batch. Valid pushes wait for a short window (or until every
rank seen recently has one waiting, or a row/byte cap is reached); pushes of the same run
and token are then merged into one Arrow IPC batch and sent upstream in one request.

The guarantee: a push is answered 200 only after the collector answered 200 to the merged
batch holding it (which, for the collector, means committed). When the collector cannot be
reached, times out or answers 502/503/504, every push of that batch gets 503 (with
``Retry-After``), 502 or 504, which the exporter treats like a collector outage: it spills
the batch and replays it later. The store ignores rows it already holds, so a batch stored
whose answer was lost and sent again adds nothing. Should the collector refuse a merged
batch (a 4xx other than 401/403/408/429) or fail to store it (500), or merging fail, its
pushes are forwarded one by one so each gets its own answer: one rank's unstorable rows
fail that rank's push alone (the exporter drops what is refused and sets aside what keeps
failing), and the refusals are counted by status (``upstream_rejected`` on ``/healthz``).

It listens on TCP (``--host``/``--port``) or, as the exporters start it, on a Unix socket
in the user's private directory (``--socket``), which only that user can connect to.

The exporter's side (local rank 0 starts a relay when none listens, and every rank sends
to it, straight to the collector while it is away) is :mod:`goodlens.exporter.relay_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http.client
import logging
import os
import socket
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from goodlens.exporter.relay_client import DEFAULT_RELAY_PORT, endpoint
from goodlens.exporter.transport import is_loopback
from goodlens.model.batch import Batch
from goodlens.model.schema import SCHEMA_VERSION, STEP_COLUMNS
from goodlens.model.wire import ARROW as ARROW_STREAM
from goodlens.model.wire import META_KEY

log = logging.getLogger("goodlens.relay")

_STEP_REQUIRED = {c.name for c in STEP_COLUMNS if c.required}
_RETRY_PASS = {429, 503}  # upstream overload: passed on with its Retry-After
_AUTH = {401, 403}        # upstream refused the token: every push of the batch learns why
_MAX_SOURCES = 100_000


@dataclass
class RelayConfig:
    """Where the relay listens, where it forwards, and how long it gathers."""

    upstream: str
    """Collector base URL, e.g. ``http://collector:8470``."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback requires ``token``."""
    port: int = DEFAULT_RELAY_PORT
    """TCP port (0 picks a free one); with ``socket``, only names the relay."""
    socket: str | None = None
    """Listen on this Unix socket (mode 0600, in a directory of this user) instead of TCP."""
    token: str | None = None
    """Bearer token pushers must send; also sent upstream unless ``upstream_token`` is set.
    Without either, each push's own ``Authorization`` header is passed through."""
    upstream_token: str | None = None
    """Bearer token for the collector, when it differs from ``token``."""
    window_s: float = 0.1
    """Longest a push waits for others to join it (0: forward at once)."""
    max_batch_rows: int = 200_000
    """Most rows in one merged batch."""
    max_batch_bytes: int = 16 * 1024 * 1024
    """Most pushed bytes in one merged batch (keep it under the collector's ``--max-body``)."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest accepted push; bigger ones get 413 (as from the collector)."""
    max_pending_bytes: int = 256 * 1024 * 1024
    """Pushed bytes waiting for the collector before new pushes get 503."""
    timeout_s: float = 2.0
    """HTTP timeout of one upstream request."""
    answer_within_s: float = 4.5
    """Every push is answered within this long of arriving (below the exporter's 5 s
    timeout, so it never gives up on a push the collector may still store and re-sends it):
    a push that has waited so long that its forward could end later gets 503 at once."""
    idle_exit_s: float = 0.0
    """Exit after this long without a push (0: never); exporter-started relays use 10 min."""
    active_s: float = 10.0
    """A source that pushed this recently is expected in the next window: once every such
    source has a push waiting, the batch goes without waiting out the window."""

    def __post_init__(self) -> None:
        endpoint(self.upstream)
        if not (0 <= self.port <= 65535):
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.window_s < 0 or self.timeout_s <= 0 or self.idle_exit_s < 0:
            raise ValueError("window and idle exit must not be negative, timeout positive")
        if self.answer_within_s <= self.timeout_s + self.window_s:
            raise ValueError("answer_within_s must exceed the upstream timeout plus the window")
        if min(self.max_batch_rows, self.max_batch_bytes, self.max_body_bytes,
               self.max_pending_bytes) <= 0:
            raise ValueError("row and byte limits must be positive")
        if not self.socket and not is_loopback(self.host) and not self.token:
            raise ValueError(f"binding {self.host} exposes the relay beyond this machine; "
                             "pass --token so only your exporters can push")


# ----------------------------------------------------------------------------- merging


def merge_batches(run_id: str, batches: list[Batch],
                  exporter: dict[str, Any] | None = None) -> bytes:
    """Validated batches of one run as one Arrow IPC wire batch, rows in the given order.

    Step rows travel as the record batch (columns that are null throughout are left out; the
    collector fills them in again), events as JSON columns in the metadata, run metadata
    merged with later non-null values winning (as the store would), and ``exporter`` (if
    given) as the batch's exporter counters.
    """
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "run_id": run_id}
    run: dict[str, Any] | None = None
    for b in batches:
        if b.run is not None:
            run = {} if run is None else run
            for key, value in b.run.items():
                if value is not None or key not in run:
                    run[key] = value
    if run is not None:
        doc["run"] = run
    events = [b.events for b in batches if b.events is not None and b.events.num_rows]
    if events:
        table = pa.concat_tables(events)
        doc["events"] = {name: col.to_pylist() for name, col in
                         zip(table.column_names, table.columns) if col.null_count < len(col)}
    if exporter:
        doc["exporter"] = exporter
    steps = [b.steps for b in batches if b.steps is not None and b.steps.num_rows]
    if steps:
        table = pa.concat_tables(steps)
        keep = [i for i, (name, col) in enumerate(zip(table.column_names, table.columns))
                if name in _STEP_REQUIRED or col.null_count < len(col)]
        table = table.select(keep).combine_chunks()
    else:
        table = pa.table({})
    table = table.replace_schema_metadata({META_KEY: orjson.dumps(doc)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        if table.num_columns:
            writer.write_table(table)
    return sink.getvalue().to_pybytes()


# ----------------------------------------------------------------------------- upstream


class _Upstream:
    """One keep-alive HTTP connection to the collector, used by one thread."""

    def __init__(self, url: str, timeout_s: float) -> None:
        scheme, self._host, self._port, path = endpoint(url)
        self._https = scheme == "https"
        self._path = path + "/v1/ingest"
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, content_type: str,
             auth: str | None) -> tuple[int, bytes, str | None]:
        """(status, body, Retry-After) of one push; raises OSError when nothing answered."""
        headers = {"Content-Type": content_type}
        if auth:
            headers["Authorization"] = auth
        for fresh in (self._conn is None, True):
            try:
                if self._conn is None:
                    cls = (http.client.HTTPSConnection if self._https
                           else http.client.HTTPConnection)
                    self._conn = cls(self._host, self._port, timeout=self.timeout_s)
                    self._conn.connect()
                    with contextlib.suppress(OSError):
                        self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._conn.request("POST", self._path, body=body, headers=headers)
                resp = self._conn.getresponse()
                return resp.status, resp.read(), resp.getheader("Retry-After")
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if fresh or isinstance(exc, TimeoutError):  # the collector is away or slow
                    raise OSError(str(exc) or type(exc).__name__) from exc
                # a kept-alive connection the collector had closed: once more on a new one
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# ----------------------------------------------------------------------------- the relay

Answer = tuple[int, bytes, dict[str, str]]


@dataclass
class _Push:
    """One validated push waiting for its merged batch's answer."""

    batch: Batch
    body: bytes
    content_type: str
    auth: str | None
    source: Any
    arrived: float
    future: asyncio.Future | None = None


@dataclass
class RelayStats:
    """Counters shown on ``GET /healthz``."""

    pushes: int = 0
    """Valid pushes received."""
    push_rows: int = 0
    rejected: int = 0
    """Pushes refused before merging (invalid, token, too large, unsupported type)."""
    acked: int = 0
    """Pushes answered 200 (their rows are committed upstream)."""
    failed: int = 0
    """Pushes answered 5xx because the collector did not take their batch."""
    forwarded: int = 0
    """Requests sent to the collector."""
    forwarded_rows: int = 0
    """Rows in requests the collector acknowledged."""
    upstream_errors: int = 0
    """Requests that failed: unreachable, timeout, or a 5xx/503 answer."""
    singles: int = 0
    """Pushes forwarded one by one after the collector refused their merged batch."""
    upstream_rejected: dict[str, int] = field(default_factory=dict)
    """Pushes the collector refused (4xx) or could not store (500), by status: each
    answered with the collector's verdict for it alone."""
    last_upstream_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Relay:
    """Gathers pushes, merges them per (token, run), forwards them and answers each push.

    Lives in one asyncio loop; the upstream request (and the merging) runs in one worker
    thread, so the loop keeps taking pushes meanwhile.
    """

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.stats = RelayStats()
        self.started = time.time()
        self.last_push = time.monotonic()
        self._upstream = _Upstream(config.upstream, config.timeout_s)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="goodlens-relay-upstream")
        self._pending: list[_Push] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._waiting_bytes = 0  # pending plus in flight
        self._active: dict[Any, float] = {}
        self._dropped: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._down_until = 0.0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        # one stable exporter source per (relay, run) carries the local ranks' dropped rows
        self._source = f"relay/{socket.gethostname()}:{config.port}"
        bearer = config.upstream_token or config.token
        self._auth = f"Bearer {bearer}" if bearer else None

    # -- the request side (event loop) ----------------------------------------
    def check_token(self, header: str) -> Answer | None:
        """The 401/403 answer when this relay requires a token and ``header`` lacks it."""
        if not self.config.token:
            return None
        if not header:
            return answer(401, {"error": "missing token: send 'Authorization: Bearer "
                                 "<token>'", "field": "authorization"},
                           {"WWW-Authenticate": "Bearer"})
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), self.config.token.encode()):
            return answer(403, {"error": "wrong token", "field": "authorization"})
        return None

    async def submit(self, batch: Batch, body: bytes, content_type: str,
                     auth_header: str) -> Answer:
        """Queue a validated push; returns its answer once the collector answered."""
        now = time.monotonic()
        self.last_push = now
        self.stats.pushes += 1
        self.stats.push_rows += batch.rows
        if now < self._down_until:
            self.stats.failed += 1
            return _unavailable(f"the collector is unreachable ({self.stats.last_upstream_error})")
        if self._waiting_bytes + len(body) > self.config.max_pending_bytes:
            self.stats.failed += 1
            return answer(503, {"error": "relay: too much waiting for the collector; retry "
                                 "later", "field": None}, {"Retry-After": "1"})
        source = _source_of(batch)
        exp = batch.exporter
        if exp.get("source") and isinstance(exp.get("dropped_rows"), int):
            key = (batch.run_id, exp["source"])
            self._dropped.pop(key, None)
            self._dropped[key] = exp["dropped_rows"]
            if len(self._dropped) > _MAX_SOURCES:
                self._dropped.popitem(last=False)
        if source is not None:
            self._active[source] = now
        auth = self._auth if self._auth else (auth_header or None)
        push = _Push(batch, body, content_type, auth, source, now,
                     asyncio.get_running_loop().create_future())
        self._pending.append(push)
        self._pending_rows += batch.rows
        self._pending_bytes += len(body)
        self._waiting_bytes += len(body)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())
        assert self._wake is not None
        self._wake.set()
        try:
            return await push.future  # type: ignore[misc]
        finally:
            self._waiting_bytes -= len(body)

    def health(self) -> dict[str, Any]:
        """The ``/healthz`` body."""
        s = self.stats
        return {"status": "ok", "relay": True, "upstream": self.config.upstream,
                "pid": os.getpid(), "uptime_s": time.time() - self.started,
                "window_s": self.config.window_s, "pushes": s.pushes, "push_rows": s.push_rows,
                "rejected": s.rejected, "acked": s.acked, "failed": s.failed,
                "forwarded": s.forwarded, "forwarded_rows": s.forwarded_rows,
                "upstream_errors": s.upstream_errors, "singles": s.singles,
                "upstream_rejected": dict(s.upstream_rejected),
                "last_upstream_error": s.last_upstream_error,
                "pending_pushes": len(self._pending), "pending_rows": self._pending_rows,
                "schema_version": SCHEMA_VERSION}

    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._pending and self._waiting_bytes == 0

    def close(self) -> None:
        """Stop the upstream thread and close its connection."""
        self._pool.shutdown(wait=True)
        self._upstream.close()

    # -- gathering (event loop) -------------------------------------------------
    def _ready(self) -> bool:
        """Whether the pending pushes should go now, before the window ends."""
        cfg = self.config
        old = time.monotonic() - cfg.active_s
        for source in [s for s, seen in self._active.items() if seen < old]:
            del self._active[source]  # gone quiet (finished, restarted): not waited for
        if self._pending_rows >= cfg.max_batch_rows or self._pending_bytes >= cfg.max_batch_bytes:
            return True
        waiting = {p.source for p in self._pending}
        return None not in waiting and all(s in waiting for s in self._active)

    async def _flush_loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = self._pending[0].arrived + self.config.window_s
            while not self._ready() and (left := deadline - time.monotonic()) > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            pushes = self._take()
            # a push that waited behind a slow forward: forwarding it now could answer it
            # after its exporter gave up (which then re-sends it): tell it to retry instead
            late = time.monotonic() - (self.config.answer_within_s - self.config.timeout_s)
            for p in [p for p in pushes if p.arrived < late]:
                self.stats.failed += 1
                if p.future is not None and not p.future.done():
                    p.future.set_result(_unavailable("the collector is slow; retry"))
            pushes = [p for p in pushes if p.arrived >= late]
            if not pushes:
                continue
            exporters = {run: {"source": f"{self._source}/{run}",
                               "dropped_rows": sum(v for (r, _), v in self._dropped.items()
                                                   if r == run)}
                         for run in {p.batch.run_id for p in pushes}}
            try:
                answers = await loop.run_in_executor(self._pool, self._forward, pushes,
                                                     exporters, self._deadline(pushes))
            except Exception as exc:  # never leave a push without an answer
                log.exception("relay: forwarding failed")
                answers = [answer(500, {"error": f"relay error: {exc}", "field": None})
                           ] * len(pushes)
            for p, ans in zip(pushes, answers):
                if ans[0] == 200:
                    self.stats.acked += 1
                elif ans[0] >= 500:
                    self.stats.failed += 1
                if p.future is not None and not p.future.done():
                    p.future.set_result(ans)

    def _take(self) -> list[_Push]:
        """The oldest pending pushes, up to the row and byte caps (at least one)."""
        cfg = self.config
        rows = nbytes = n = 0
        for p in self._pending:
            if n and (rows + p.batch.rows > cfg.max_batch_rows
                      or nbytes + len(p.body) > cfg.max_batch_bytes):
                break
            rows += p.batch.rows
            nbytes += len(p.body)
            n += 1
        out, self._pending = self._pending[:n], self._pending[n:]
        self._pending_rows -= rows
        self._pending_bytes -= nbytes
        return out

    # -- forwarding (upstream thread) -------------------------------------------
    def _deadline(self, pushes: list[_Push]) -> float:
        """When the first of ``pushes`` (answered together, after the last forward) is due."""
        return min(p.arrived for p in pushes) + self.config.answer_within_s

    def _forward(self, pushes: list[_Push], exporters: dict[str, dict],
                 deadline: float) -> list[Answer]:
        groups: dict[tuple[str | None, str], list[int]] = {}
        for i, p in enumerate(pushes):
            groups.setdefault((p.auth, p.batch.run_id), []).append(i)
        answers: list[Answer | None] = [None] * len(pushes)
        for (auth, run_id), idx in groups.items():
            group = [pushes[i] for i in idx]
            for i, ans in zip(idx, self._forward_group(group, auth, run_id, exporters[run_id],
                                                       deadline)):
                answers[i] = ans
        return answers  # type: ignore[return-value]

    def _forward_group(self, group: list[_Push], auth: str | None, run_id: str,
                       exporter: dict, deadline: float) -> list[Answer]:
        if time.monotonic() < self._down_until:
            return [_unavailable(f"the collector is unreachable "
                                 f"({self.stats.last_upstream_error})")] * len(group)
        if time.monotonic() + self.config.timeout_s > deadline:  # an earlier group took it
            return [_unavailable("the collector is slow; retry")] * len(group)
        try:
            body = merge_batches(run_id, [p.batch for p in group], exporter)
        except Exception:  # a push that does not merge (odd types): each goes alone
            log.exception("relay: could not merge %d pushes; forwarding them one by one",
                          len(group))
            return self._singles(group, auth, deadline)
        rows = sum(p.batch.rows for p in group)
        result = self._send(body, ARROW_STREAM, auth)
        if isinstance(result, tuple) and result[0] == 200:
            self.stats.forwarded_rows += rows
            upstream = _loads(result[1])
            return [answer(200, {"ok": True, "relayed": True,
                                  "steps": p.batch.steps.num_rows if p.batch.steps else 0,
                                  "events": p.batch.events.num_rows if p.batch.events else 0,
                                  "merged_pushes": len(group), "upstream": upstream})
                    for p in group]
        if isinstance(result, tuple) and _verdict(result[0]):
            if len(group) > 1:
                # refused or unstorable although each push passed the collector's own
                # checks here (a 413, a value the store cannot hold, a collector of another
                # version): let each push hear its own verdict, so one rank's bad rows do
                # not fail the others
                log.warning("relay: the collector answered %s to a merged batch (%.200s); "
                            "forwarding its %d pushes one by one", result[0], result[1],
                            len(group))
                return self._singles(group, auth, deadline)
            self._count_refusal(result[0])
        return [_relay_answer(result)] * len(group)

    def _singles(self, group: list[_Push], auth: str | None,
                 deadline: float) -> list[Answer]:
        """Each push of a refused merged batch alone, all at once (each on a connection of
        its own: one after another, slow answers add up past the exporters' timeout), with
        a timeout that ends by the deadline; under half a second left, 503 (they retry)."""
        left = deadline - time.monotonic() - 0.1  # the answer's own way back
        if left < 0.5:
            return [_unavailable("the collector is slow; retry")] * len(group)
        timeout = min(self.config.timeout_s, left)

        def one(p: _Push) -> tuple[int, bytes, str | None] | Exception:
            upstream = _Upstream(self.config.upstream, timeout)
            try:
                return upstream.post(p.body, p.content_type, auth)
            except OSError as exc:
                return exc
            finally:
                upstream.close()

        with ThreadPoolExecutor(min(len(group), 16), "goodlens-relay-single") as pool:
            results = list(pool.map(one, group))
        out = []
        for p, result in zip(group, results):
            self.stats.singles += 1
            single = self._account(result)
            if isinstance(single, tuple) and single[0] == 200:
                self.stats.forwarded_rows += p.batch.rows
            elif isinstance(single, tuple) and _verdict(single[0]):
                self._count_refusal(single[0])
            out.append(_relay_answer(single))
        return out

    def _count_refusal(self, status: int) -> None:
        key = str(status)
        self.stats.upstream_rejected[key] = self.stats.upstream_rejected.get(key, 0) + 1

    def _send(self, body: bytes, content_type: str,
              auth: str | None) -> tuple[int, bytes, str | None] | Exception:
        """One upstream request: its answer, or the exception when nothing answered."""
        try:
            result: tuple[int, bytes, str | None] | Exception = self._upstream.post(
                body, content_type, auth)
        except OSError as exc:
            result = exc
        return self._account(result)

    def _account(self, result: tuple[int, bytes, str | None] | Exception
                 ) -> tuple[int, bytes, str | None] | Exception:
        """Count one upstream request's outcome (in the upstream thread); ``result``."""
        self.stats.forwarded += 1
        if isinstance(result, Exception):
            self.stats.upstream_errors += 1
            self.stats.last_upstream_error = f"{type(result).__name__}: {result}"
            if not isinstance(result.__cause__, TimeoutError):
                self._down_until = time.monotonic() + 1.0  # answer 503 at once for a second
            return result
        status, payload, _ = result
        if status >= 500 or status in (408, 429):
            self.stats.upstream_errors += 1
            self.stats.last_upstream_error = f"collector answered {status}: {payload[:200]!r}"
        return result


def _verdict(status: int) -> bool:
    """Whether an upstream answer is about the batch itself: a refusal (4xx other than
    401/403/408/429) or a failure to store it (500), not the collector's absence."""
    return status == 500 or (400 <= status < 500 and status not in _AUTH
                             and status not in (408, 429))


def _source_of(batch: Batch) -> Any:
    """Who pushed: the exporter's source, else (run, rank) of a one-rank batch, else None."""
    src = batch.exporter.get("source")
    if src:
        return src
    if batch.steps is not None and batch.steps.num_rows:
        ranks = batch.steps.column("rank")
        first = ranks[0].as_py()
        if ranks.null_count == 0 and first is not None:
            return (batch.run_id, first)
    return None


def answer(status: int, obj: Any, headers: dict[str, str] | None = None) -> Answer:
    return status, orjson.dumps(obj), headers or {}


def _unavailable(why: str) -> Answer:
    return answer(503, {"error": f"relay: {why}; retry later", "field": None},
                   {"Retry-After": "1"})


def _loads(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload[:300].decode("utf-8", "replace")


def _relay_answer(result: tuple[int, bytes, str | None] | Exception) -> Answer:
    """What a push hears when its batch was not acknowledged as part of a merged batch."""
    if isinstance(result, Exception):
        if isinstance(result.__cause__, TimeoutError):
            return answer(504, {"error": f"relay: the collector did not answer in time "
                                 f"({result})", "field": None})
        return _unavailable(f"the collector is unreachable ({result})")
    status, payload, retry = result
    if status in _RETRY_PASS:
        return status, payload, {"Retry-After": retry or "1"}
    if (status >= 500 and status != 500) or status == 408:
        return answer(502, {"error": f"relay: the collector answered {status}: "
                             f"{payload[:300].decode('utf-8', 'replace')}", "field": None})
    return status, payload, {}  # its own answer (200, a 4xx, or 500: could not store it)
