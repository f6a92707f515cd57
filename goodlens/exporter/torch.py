"""PyTorch integration: a few lines in a DDP loop give goodlens the compute/collective split,
checkpoint stalls, attempts and their start-up.

Why it exists: the accounting (straggler wait, checkpoint stall, recompute, restart) needs
facts a plain step timer cannot see. A rank waiting in an all-reduce for a slow peer looks
as slow as the peer itself unless the collective wait is separated from compute, and an
asynchronous checkpoint stalls training only for its blocking part. This module measures
both where they happen, inside DDP and around ``torch.distributed.checkpoint`` (DCP), and
sends them through a :class:`~goodlens.exporter.recorder.RankExporter`:

- :func:`instrument` times DDP's collectives as ``collective`` wait
  (:mod:`goodlens.exporter.torch_collectives`): by default the wait *exposed* at the end of
  ``backward()`` (autograd callbacks around DDP's finalisation; DDP keeps its C++
  all-reduce), or with ``collectives="hook"`` a communication hook timing each bucket from
  launch to completion (CUDA events on CUDA buckets; the default for CUDA models).
- :func:`save_checkpoint` / :func:`load_checkpoint` wrap DCP ``save``, ``async_save`` and
  ``load`` and emit ``ckpt_save_start``, ``ckpt_save_blocking_end`` (training may go on),
  ``ckpt_save_durable_end`` (the files are written; with this rank's bytes) and
  ``ckpt_restore_start`` / ``ckpt_restore_end`` (with the bytes this rank read), and
  between them ``ckpt_restore_progress`` (bytes read so far, the phase; sent from a
  thread at most once a second, :mod:`goodlens.exporter.restore`);
  :func:`watching_dcp_loads` does the same for the ``dcp.load`` calls a framework makes
  (torchtitan's checkpointer).
  Asynchronous saves run their collectives on a dedicated gloo group (on the default group
  they would interleave with DDP's all-reduces from another thread, and the ranks hang),
  and a save first waits for the previous one, inside its recorded stall.
- Attempts need no user code: ``RankExporter.from_env`` reads torchrun's
  ``TORCHELASTIC_RESTART_COUNT``, and the first call into this module for an exporter emits
  ``attempt_start`` and ``init_start`` at the *process's* start (from the OS, see
  :func:`~goodlens.exporter.lifecycle.process_start_time`: start-up before ``import
  goodlens`` counts) and ``init_end`` now.
- :func:`init_process_group`: a process group that survives a torchrun restart on gloo.

Only users who have torch import this module; it imports nothing from torch at goodlens
import time.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from goodlens.exporter import lifecycle
from goodlens.exporter.restore import RestoreProgress
from goodlens.exporter.torch_collectives import (  # noqa: F401 - re-exported for tests
    MODES,
    _CollectiveTimer,
    _DeviceCollectiveTimer,
    _ExposedWaitTimer,
    _timed_allreduce_hook,
    _union_length,
    attach,
    torch,
)
from goodlens.model.schema import EventKind

__all__ = [EventKind.ATTEMPT_END, "init_process_group", "instrument", "load_checkpoint",
           "save_checkpoint", "watching_dcp_loads"]

log = logging.getLogger("goodlens.exporter.torch")

_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()
_STARTED_LOCK = threading.Lock()


def _ensure_attempt_start(exporter: Any) -> None:
    """Emit ``attempt_start`` once per exporter (the attempt number comes from torchrun).

    For the attempt the process started in, ``attempt_start`` and ``init_start`` are dated
    at the process's start from the OS (the earliest rank's is the attempt's start), so a
    restarted attempt's start-up is ``restart.init`` and the first attempt's is in the
    wall-clock; ``init_end`` is now. An attempt begun in-process (``new_attempt``) starts
    now.
    """
    with _STARTED_LOCK:
        if exporter in _STARTED:
            return
        _STARTED.add(exporter)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    fields: dict[str, Any] = {}
    if world is not None:
        fields["world_size"] = world
    config = getattr(exporter, "config", None)
    first = config is None or getattr(config, "attempt", None) == exporter.attempt
    if not first:
        exporter.event(EventKind.ATTEMPT_START, **fields)
        return
    started = lifecycle.process_start_time()
    exporter.event(EventKind.ATTEMPT_START, time_s=started, **fields)
    exporter.event(EventKind.INIT_START, time_s=started)
    exporter.event(EventKind.INIT_END, time_s=time.time())


def attempt_end(exporter: Any, cause: str = "completed", step: int | None = None) -> None:
    """Emit ``attempt_end`` (call once at the end of a successful run)."""
    _ensure_attempt_start(exporter)
    fields: dict[str, Any] = {"cause": cause}
    if step is not None:
        fields["step"] = step
    exporter.event(EventKind.ATTEMPT_END, **fields)


def instrument(model: Any, exporter: Any, process_group: Any = None,
               collectives: str = "auto") -> Any:
    """Time the collectives of a ``DistributedDataParallel`` or FSDP2 (``fully_shard``)
    model as collective wait.

    FSDP2: every all-gather and reduce-scatter of every FSDP module in the tree, as the time
    the training thread is blocked in it (:mod:`goodlens.exporter.torch_fsdp`; call after
    ``fully_shard``; ``collectives`` other than ``off`` all mean that). DDP,
    ``collectives``: ``exposed`` (the training thread's wait at the end of ``backward()``,
    no communication hook), ``hook`` (a communication hook equivalent to DDP's default,
    timing each bucket from launch to completion; do not register another hook), ``auto``
    (``hook`` for a model on CUDA, else ``exposed``) or ``off``. Call it before the first
    backward. Returns the model; a model that is neither is returned unchanged. Also emits
    ``attempt_start`` for this exporter if not yet done.
    """
    _ensure_attempt_start(exporter)
    if not getattr(exporter, "enabled", True):
        return model
    if collectives not in MODES:
        raise ValueError(f"collectives must be one of {MODES}, not {collectives!r}")
    if collectives != "off" and not hasattr(model, "register_comm_hook"):
        from goodlens.exporter import torch_fsdp  # FSDP2: its all-gathers and reduce-scatters
        if torch_fsdp.attach(model, exporter):
            return model
    attach(model, exporter, process_group, collectives)
    return model


def init_process_group(backend: str = "gloo", timeout: timedelta | None = None,
                       **options: Any) -> None:
    """``dist.init_process_group`` that survives a torchrun restart.

    torchrun's agent keeps one TCPStore for the whole job (``MASTER_ADDR``/``MASTER_PORT``,
    ``TORCHELASTIC_USE_AGENT_STORE=True``), and a plain ``init_process_group`` uses the
    same keys in every attempt: a restarted gloo rank can read the address a dead rank
    published and fail in ``connectFullMesh`` (torch 2.13, 4 ranks on one host: every
    restart tried). Here the keys are prefixed with the attempt (``GOODLENS_ATTEMPT``, else
    ``TORCHELASTIC_RESTART_COUNT``). Outside torchrun (no ``TORCHELASTIC_RUN_ID``) this is
    ``dist.init_process_group(backend)``. See docs/pytorch.md for several hosts.
    """
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or "store" in options:
        dist.init_process_group(backend, timeout=timeout, **options)
        return
    attempt = env.get("GOODLENS_ATTEMPT") or env.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=timeout or timedelta(seconds=300))
    dist.init_process_group(backend, store=dist.PrefixStore(f"goodlens-attempt-{attempt}",
                                                            store),
                            rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                            timeout=timeout, **options)


# ----------------------------------------------------------------------------- checkpoints

_ASYNC_LOCK = threading.Lock()
_ASYNC_GROUP: list[Any] = []  # [(default group, its dedicated gloo group for async saves)]
_PENDING: list[Future] = []  # the async save in flight on that group, if any


def _async_group() -> Any:
    """The gloo group async saves use (all ranks create it at their first async save).

    DCP's thread executor runs ``save``'s collectives (plan gather, metadata) in a
    background thread; on the default group they interleave with DDP's all-reduces from
    the training thread in a different order on each rank, and the job hangs (with torch
    2.13 and gloo the first async save never finishes). A second group keeps
    the two streams of collectives apart; it is gloo because async save needs a CPU
    backend.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.distributed_c10d._get_default_group()
    with _ASYNC_LOCK:
        if _ASYNC_GROUP and _ASYNC_GROUP[0][0] is world:
            return _ASYNC_GROUP[0][1]
    group = dist.new_group(backend="gloo")
    with _ASYNC_LOCK:
        _ASYNC_GROUP[:] = [(world, group)]
    return group


@atexit.register
def _forget_async_state() -> None:
    """Drop this module's references to the async-save group and futures at exit.

    ``atexit`` handlers run while the interpreter is whole. A process group or a failed
    save's exception (its traceback holds the save's frames, tensors and group) still
    referenced by module globals would otherwise be destroyed during interpreter
    finalization, where gloo objects that reach back into Python can abort the process
    ("terminate called without an active exception"; see pytorch/pytorch#179291).
    """
    with _ASYNC_LOCK:
        _ASYNC_GROUP.clear()
        _PENDING.clear()


def _checkpoint_files(path: str, rank: int) -> list[str]:
    """The files of a DCP checkpoint folder written by ``rank`` (its shards; the
    coordinator, rank 0, also writes the global ``.metadata``)."""
    names = glob.glob(os.path.join(path, f"__{rank}_*.distcp"))
    names += glob.glob(os.path.join(path, f"__{rank}.metadata"))  # use_collectives=False
    if rank == 0:
        names.append(os.path.join(path, ".metadata"))
    return names


def _rank_bytes(path: str, rank: int) -> int:
    """Bytes this rank wrote to a DCP checkpoint folder (see :func:`_checkpoint_files`)."""
    total = 0
    for name in _checkpoint_files(path, rank):
        try:
            total += os.path.getsize(name)
        except OSError:
            pass
    return total


def _rank(group: Any = None) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group) if group is not None else dist.get_rank()


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike[str], exporter: Any,
                    step: int, async_: bool = False, tier: str = "durable",
                    process_group: Any = None, **dcp_options: Any) -> Any:
    """Save ``state`` with DCP (``save``, or ``async_save`` when ``async_``), recording it.

    Events: ``ckpt_save_start``; ``ckpt_save_blocking_end`` when training can go on (the
    save returned; for an async save, ``async_save`` returned, i.e. the state was staged to
    CPU memory, or, with an asynchronous stager, staging completed);
    ``ckpt_save_durable_end`` with this rank's bytes once the files are written (not emitted
    when the save fails). An async save first waits for the previous async save to finish
    (inside its recorded stall): both would use the same process group.

    ``dcp_options`` go to DCP as they are (``storage_writer``, ``planner``, and for async
    ``async_checkpointer_type``, ``async_stager``). ``process_group``: default, the default
    group for ``save`` and a dedicated gloo group for ``async_save``.

    Returns ``None`` for a synchronous save. For an async save, what ``async_save`` returns
    (a ``Future``, or an ``AsyncSaveResponse`` with an asynchronous stager) with the upload
    future replaced by one that completes after ``ckpt_save_durable_end`` is recorded, so
    ``result()`` followed by ``exporter.close()`` loses no event.
    """
    _ensure_attempt_start(exporter)
    path = os.fspath(path)
    exporter.event(EventKind.CKPT_SAVE_START, step=step, tier=tier)
    import torch.distributed.checkpoint as dcp  # the first import (~0.1 s) is in the stall
    if not async_:
        dcp.save(state, checkpoint_id=path, process_group=process_group, **dcp_options)
        exporter.event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=tier)
        exporter.event(EventKind.CKPT_SAVE_DURABLE_END, step=step, tier=tier,
                       bytes=_rank_bytes(path, _rank(process_group)))
        return None
    with _ASYNC_LOCK:
        previous = list(_PENDING)
    if previous:  # one async save at a time on the group; waiting is a stall (a failure
        wait(previous)  # is its own future's to report: DCP raises a BaseException)
    group = process_group if process_group is not None else _async_group()
    rank = _rank(group)
    response = dcp.async_save(state, checkpoint_id=path, process_group=group, **dcp_options)
    upload = getattr(response, "upload_completion", response)
    staging = getattr(response, "staging_completion", None)
    if staging is None:
        exporter.event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=tier)
    else:
        staging.add_done_callback(
            lambda _: exporter.event(EventKind.CKPT_SAVE_BLOCKING_END, step=step, tier=tier))
    recorded: Future = Future()

    def durable(f: Future) -> None:
        try:
            value = f.result()
        except BaseException as exc:
            log.warning("goodlens: async checkpoint %s failed: %r", path, exc)
            recorded.set_exception(exc)
        else:
            exporter.event(EventKind.CKPT_SAVE_DURABLE_END, step=step, tier=tier,
                           bytes=_rank_bytes(path, rank))
            recorded.set_result(value)
        with _ASYNC_LOCK:
            if recorded in _PENDING:
                _PENDING.remove(recorded)

    with _ASYNC_LOCK:
        _PENDING[:] = [recorded]
    upload.add_done_callback(durable)
    if upload is response:
        return recorded
    response.upload_completion = recorded
    return response


def _count_reads(reader: Any) -> list[Any]:
    """Wrap ``reader.read_data`` (on this instance) to add up what each call reads: for every
    read item of the plan, the length of the stored chunk it is read from (DCP's
    ``FileSystemReader`` reads that whole slice of its file). Returns ``[bytes, measured]``;
    ``measured`` stays False for a reader without DCP's ``storage_data`` lengths."""
    counted: list[Any] = [0, False]
    original = reader.read_data

    def read_data(plan: Any, planner: Any) -> Any:
        try:
            stored = reader.storage_data
            counted[0] += sum(int(stored[item.storage_index].length) for item in plan.items)
            counted[1] = True
        except (AttributeError, KeyError, TypeError, ValueError):
            pass
        return original(plan, planner)

    reader.read_data = read_data
    return counted


def _metadata_bytes(path: str | None) -> int:
    """Size of a DCP checkpoint's ``.metadata`` (every rank reads it before the data)."""
    try:
        return os.path.getsize(os.path.join(path, ".metadata"))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return 0


def _tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_bytes(v) for v in state)
    return 0


def _watch_items(reader: Any, planner: Any, progress: RestoreProgress) -> None:
    """Count each read item into ``progress`` as DCP commits it to the state (``commit_tensor``
    and ``load_bytes`` on this planner instance): the length of its stored chunk (the
    reader's ``storage_data``), else the committed tensor's bytes. When ``read_data`` is
    called, the plan's total is known (``bytes_total``); when it returns, this rank has
    read everything and waits for the others (phase ``barrier``)."""
    def length(item: Any, value: Any = None) -> int:
        try:
            return int(reader.storage_data[item.storage_index].length)
        except (AttributeError, KeyError, TypeError, ValueError):
            return _tensor_bytes(value)

    commit, load_bytes, read_data = planner.commit_tensor, planner.load_bytes, reader.read_data

    def commit_tensor(item: Any, tensor: Any) -> Any:
        out = commit(item, tensor)
        progress.add(length(item, tensor))
        return out

    def load(item: Any, value: Any) -> Any:
        out = load_bytes(item, value)
        progress.add(length(item))
        return out

    def read(plan: Any, planner_: Any) -> Any:
        try:
            stored = reader.storage_data
            progress.bytes_total = progress.bytes + sum(
                int(stored[i.storage_index].length) for i in plan.items)
        except (AttributeError, KeyError, TypeError, ValueError):
            pass
        out = read_data(plan, planner_)
        progress.phase("barrier")
        return out

    planner.commit_tensor, planner.load_bytes, reader.read_data = commit_tensor, load, read


def _watch_load(progress: RestoreProgress, path: str | None, reader: Any, planner: Any
                ) -> tuple[Any, Any, Callable[[], None]]:
    """The reader and planner of one DCP load of ``path`` (DCP's own where None), their read
    items counted into ``progress`` (:func:`_watch_items`, the ``.metadata`` first); and
    what puts a caller's instances back as they were."""
    import torch.distributed.checkpoint as dcp
    own, own_planner = reader is None, planner is None
    if own:
        reader = dcp.FileSystemReader(path)
    if own_planner:
        planner = dcp.DefaultLoadPlanner()
    _watch_items(reader, planner, progress)
    progress.add(_metadata_bytes(path))

    def undo() -> None:
        if not own:
            del reader.read_data  # the caller's reader as it was
        if not own_planner:
            del planner.commit_tensor, planner.load_bytes

    return reader, planner, undo


@contextlib.contextmanager
def watching_dcp_loads(progress: Callable[[], RestoreProgress | None]) -> Iterator[None]:
    """Inside the block, each ``torch.distributed.checkpoint.load`` call a framework makes
    (torchtitan's ``dcp_load``: ``dcp.load(state_dict, checkpoint_id=...)``) counts its
    read items into ``progress()`` (called at each load: the restore's, started at the
    first; None: that load is not watched), phase ``read`` at each load's start and
    ``barrier`` when this rank's reads are done. The module attribute is replaced for the
    block only: for the training thread's restore, while nothing else loads."""
    import torch.distributed.checkpoint as dcp
    original = dcp.load
    watched = [0]   # loads watched in the block

    @functools.wraps(original)
    def load(state_dict: Any, *, checkpoint_id: Any = None, storage_reader: Any = None,
             planner: Any = None, **options: Any) -> Any:
        undo = None
        try:
            p = progress()
            if p is not None:
                if watched[0]:
                    p.phase("read")   # a second load: reading again (the first: started)
                watched[0] += 1
                path = None if checkpoint_id is None else os.fspath(checkpoint_id)
                if storage_reader is None:   # the reader DCP makes for it (fsspec paths too)
                    from torch.distributed.checkpoint._storage_utils import _storage_setup
                    storage_reader = _storage_setup(None, checkpoint_id, reader=True)
                storage_reader, planner, undo = _watch_load(p, path, storage_reader, planner)
        except Exception:
            log.warning("goodlens: this load's progress is not watched", exc_info=True)
        try:
            return original(state_dict, checkpoint_id=checkpoint_id,
                            storage_reader=storage_reader, planner=planner, **options)
        finally:
            if undo is not None:
                undo()

    dcp.load = load
    try:
        yield
    finally:
        dcp.load = original


def load_checkpoint(state: dict[str, Any], path: str | os.PathLike[str], exporter: Any,
                    step: int | None = None, tier: str = "durable",
                    process_group: Any = None, **dcp_options: Any) -> dict[str, Any]:
    """Load ``state`` in place from a DCP checkpoint, recording ``ckpt_restore_start``,
    ``ckpt_restore_progress`` (bytes read so far and the phase, :mod:`goodlens.exporter.
    restore`) and ``ckpt_restore_end`` with the bytes this rank read.

    Bytes read: with DCP's file-system reader (the default; or a ``storage_reader`` with
    its ``storage_data``), the checkpoint's ``.metadata`` plus, over the load plan's read
    items, the stored chunks they were read from, so under DDP, where every rank loads the
    whole model, each rank reports the whole model (plus the checkpoint's non-tensor
    entries). With a reader that does not expose those lengths: the bytes of the tensors
    in ``state`` after loading. Progress moves as each read item is committed to ``state``
    (a planner's ``commit_tensor``/``load_bytes``; ``planner`` may be given, it is wrapped
    on the instance and given back as it was); phases ``read``, then ``barrier`` once this
    rank's reads are done and DCP waits for the other ranks. Returns ``state``.
    """
    _ensure_attempt_start(exporter)
    path = os.fspath(path)
    fields: dict[str, Any] = {"tier": tier}
    if step is not None:
        fields["step"] = step
    exporter.event(EventKind.CKPT_RESTORE_START, **fields)
    progress = RestoreProgress(exporter, **fields).start()
    import torch.distributed.checkpoint as dcp  # the first import (~0.1 s) is restore time
    reader, planner, undo = _watch_load(progress, path, dcp_options.pop("storage_reader", None),
                                        dcp_options.pop("planner", None))
    counted = _count_reads(reader)
    try:
        dcp.load(state, checkpoint_id=path, storage_reader=reader, planner=planner,
                 process_group=process_group, **dcp_options)
    finally:
        progress.stop()
        undo()
    read = counted[0] + _metadata_bytes(path) if counted[1] else _tensor_bytes(state)
    exporter.event(EventKind.CKPT_RESTORE_END, bytes=read, **fields)
    return state
