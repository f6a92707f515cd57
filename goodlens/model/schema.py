"""The goodlens data model: what a run, an attempt, a per-rank step and an event are.

Every other part (the exporter's wire batches, the collector's validation, the DuckDB
schema, the Parquet trace format and ``docs/data-model.md``) is derived from the column
specifications here, so a field is added in exactly one place.

Units: times are seconds. Instants (``start_time``, ``time``) are Unix epoch seconds on the
clock of the host that recorded them; durations end in ``_s``. Byte counts are bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: Version of the schema (wire batches, store and trace format). Bump on any breaking change.
SCHEMA_VERSION = 1


class EventKind(enum.StrEnum):
    """Things that happen to a job, as opposed to per-step timings (meanings in ``KIND_DOCS``)."""

    ATTEMPT_START = "attempt_start"
    ATTEMPT_END = "attempt_end"
    INIT_START = "init_start"
    INIT_END = "init_end"
    CKPT_SAVE_START = "ckpt_save_start"
    CKPT_SAVE_BLOCKING_END = "ckpt_save_blocking_end"
    CKPT_SAVE_DURABLE_END = "ckpt_save_durable_end"
    CKPT_RESTORE_START = "ckpt_restore_start"
    CKPT_RESTORE_END = "ckpt_restore_end"
    CKPT_RESTORE_PROGRESS = "ckpt_restore_progress"
    FAILURE = "failure"
    FAILURE_DETECTED = "failure_detected"
    RANK_EVICTED = "rank_evicted"
    RANK_JOINED = "rank_joined"
    WORLD_RESIZED = "world_resized"
    PREEMPTED = "preempted"
    CUSTOM_BEGIN = "custom_begin"
    CUSTOM_END = "custom_end"
    HEARTBEAT = "heartbeat"
    STRAGGLER_FLAGGED = "straggler_flagged"
    GROUP_START = "group_start"
    GROUP_END = "group_end"
    QUORUM = "quorum"
    STEP_DISCARDED = "step_discarded"
    HEAL_START = "heal_start"
    HEAL_END = "heal_end"


EVENT_KINDS: frozenset[str] = frozenset(k.value for k in EventKind)

RESTORE_PHASES: tuple[str, ...] = ("read", "load", "barrier")
"""The phases of a rank's restore (``label`` of ``ckpt_restore_progress``): reading the
checkpoint, loading what was read into the model, waiting for the other ranks."""

MAX_RANK = 2**24 - 1
"""Largest rank accepted (16.7M ranks; keeps the collector's per-rank state bounded)."""
MAX_ATTEMPT = 2**31 - 1
MAX_EPOCH_S = 4_102_444_800
"""Largest instant accepted (2100-01-01): milliseconds or nanoseconds since the epoch sent
by mistake are refused instead of stored as dates thousands of years away."""
MIN_EPOCH_S = 0
"""Smallest instant accepted by default (the epoch; a collector may narrow the window)."""
MAX_DURATION_S = 86_400.0
"""Longest step duration or wait accepted by default (a day; a collector may change it)."""
MAX_GPUS_PER_RANK = 1024
MAX_INT = 2**63 - 1
"""Largest integer of any integer column (stored as 64-bit signed)."""
MAX_STR_BYTES = 4096
"""Longest string value (UTF-8 bytes) of a column without its own ``max_len``."""
MAX_TEXT_BYTES = 65_536
"""Longest free-form JSON text (``detail``, run ``tags``)."""


@dataclass(frozen=True)
class Column:
    """One column of a table, with the facts every layer needs about it."""

    name: str
    kind: str
    """``int``, ``float`` or ``str``; mapped to DuckDB/Arrow types by the layers that need them."""
    unit: str
    doc: str
    required: bool = False
    """A batch without this column is rejected; nullable columns may be omitted."""
    nonnegative: bool = False
    """Values below zero are rejected (durations, counts)."""
    maximum: int | None = None
    """Largest accepted value (ranks and attempts are bounded so per-rank state stays small)."""
    max_len: int = MAX_STR_BYTES
    """Longest accepted string value in UTF-8 bytes (``str`` columns)."""


#: Per-rank step records: one row per (run, attempt, rank, step).
STEP_COLUMNS: tuple[Column, ...] = (
    Column("attempt", "int", "", "attempt number, 0 for the first incarnation", required=True,
           nonnegative=True, maximum=MAX_ATTEMPT),
    Column("rank", "int", "", "global rank (below 2^24)", required=True, nonnegative=True,
           maximum=MAX_RANK),
    Column("host", "str", "", "host name the rank ran on"),
    Column("step", "int", "", "training step number (repeats after a rollback)", required=True,
           nonnegative=True),
    Column("start_time", "float", "s (epoch)",
           "when the step began, on the rank's host clock (seconds, before 2100)",
           required=True, maximum=MAX_EPOCH_S),
    Column("duration_s", "float", "s", "wall time of the step on this rank", required=True,
           nonnegative=True),
    Column("compute_s", "float", "s",
           "time computing: duration minus collective and data waits (null if not measured)",
           nonnegative=True),
    Column("collective_wait_s", "float", "s", "time blocked in collectives (all-reduce, ...)",
           nonnegative=True),
    Column("data_wait_s", "float", "s", "time waiting for the next batch from the data loader",
           nonnegative=True),
    Column("tokens", "int", "tokens", "tokens processed in the step on this rank",
           nonnegative=True),
    Column("samples", "int", "samples", "samples processed in the step on this rank",
           nonnegative=True),
)

#: Events: one row per (run, source, seq); ``source`` is the emitting exporter.
EVENT_COLUMNS: tuple[Column, ...] = (
    Column("source", "str", "", "id of the emitter (one per exporter process)", required=True),
    Column("seq", "int", "", "event number within the source, from 0, increasing",
           required=True, nonnegative=True),
    Column("kind", "str", "", "one of the event kinds (see below)", required=True),
    Column("time", "float", "s (epoch)",
           "when it happened, on the emitter's clock (seconds, before 2100)",
           required=True, maximum=MAX_EPOCH_S),
    Column("attempt", "int", "", "attempt the event belongs to", required=True,
           nonnegative=True, maximum=MAX_ATTEMPT),
    Column("rank", "int", "", "rank concerned, null for job-level events", nonnegative=True,
           maximum=MAX_RANK),
    Column("host", "str", "", "host concerned"),
    Column("step", "int", "", "step concerned (checkpoint step, restored step, last step)",
           nonnegative=True),
    Column("bytes", "int", "bytes", "checkpoint size written or read", nonnegative=True),
    Column("tier", "str", "", "checkpoint tier: memory (peer copy), local, durable"),
    Column("cause", "str", "", "failure cause, or why an attempt ended"),
    Column("label", "str", "", "label of a custom interval"),
    Column("world_size", "int", "ranks", "new world size (world_resized, attempt_start)",
           nonnegative=True, maximum=MAX_RANK + 1),
    Column("detail", "str", "", "free-form JSON text with anything else",
           max_len=MAX_TEXT_BYTES),
)

#: Run metadata (one row per run). Sent in a batch's ``run`` object; later values win.
RUN_COLUMNS: tuple[Column, ...] = (
    Column("name", "str", "", "human-readable name"),
    Column("world_size", "int", "ranks", "ranks at launch", nonnegative=True,
           maximum=MAX_RANK + 1),
    Column("gpus_per_rank", "int", "GPUs", "accelerators driven by one rank (usually 1)",
           nonnegative=True, maximum=MAX_GPUS_PER_RANK),
    Column("global_batch", "int", "samples", "global batch size", nonnegative=True),
    Column("model_params", "int", "parameters", "model parameter count", nonnegative=True),
    Column("tags", "str", "", "free-form JSON object of tags", max_len=MAX_TEXT_BYTES),
)

STEP_KEY = ("run_id", "attempt", "rank", "step")
EVENT_KEY = ("run_id", "source", "seq")


def data_model_markdown() -> str:
    """The data model as Markdown tables (``docs/data-model.md`` is generated from this)."""
    out = [f"Schema version: **{SCHEMA_VERSION}**.\n"]
    for title, cols in (("Run", RUN_COLUMNS), ("Step record", STEP_COLUMNS),
                        ("Event", EVENT_COLUMNS)):
        out.append(f"### {title}\n\n| column | type | unit | required | meaning |\n"
                   "|---|---|---|---|---|")
        for c in cols:
            req = "yes" if c.required else ""
            out.append(f"| `{c.name}` | {c.kind} | {c.unit} | {req} | {c.doc} |")
        out.append("")
    out.append("### Event kinds\n\n| kind | meaning |\n|---|---|")
    for k in EventKind:
        out.append(f"| `{k.value}` | {KIND_DOCS[k.value]} |")
    return "\n".join(out) + "\n"


#: What each event kind means, and which fields it uses.
KIND_DOCS: dict[EventKind, str] = {
    EventKind.ATTEMPT_START: "a new incarnation of the job started; `world_size` at launch",
    EventKind.ATTEMPT_END: (
        "an attempt ended; `cause`: completed, failed, preempted, resized (none: a clean end)"
    ),
    EventKind.INIT_START: "initialisation began (process group, model, data loader)",
    EventKind.INIT_END: "initialisation finished",
    EventKind.CKPT_SAVE_START: (
        "a checkpoint save began (`step`, `tier`); training blocked from here"
    ),
    EventKind.CKPT_SAVE_BLOCKING_END: (
        "training continues; the rest of the save runs in the background"
    ),
    EventKind.CKPT_SAVE_DURABLE_END: "the checkpoint is safely stored (`bytes`, `tier`)",
    EventKind.CKPT_RESTORE_START: "loading a checkpoint began (`step` restored, `tier` read from)",
    EventKind.CKPT_RESTORE_END: "loading finished (`bytes` read)",
    EventKind.CKPT_RESTORE_PROGRESS: (
        "a rank's restore in progress (at most one a second, plus each phase change): "
        "`bytes` read so far, `label` the phase (read, load, barrier), `detail` "
        "`bytes_total` when known, `live_bytes` (true when `bytes` moves within a phase) and "
        "`ended` (true on the last event of a restore with no `ckpt_restore_end`: a heal)"
    ),
    EventKind.FAILURE: (
        "the instant a failure happened (`cause`, `rank`, `host`), recorded by whoever knew "
        "first (the dying process, a surviving rank, the launcher); `failure_detected` is "
        "when it was noticed"
    ),
    EventKind.FAILURE_DETECTED: (
        "a failure was detected (`cause`: gpu, network, hang, ...; `rank`/`host`)"
    ),
    EventKind.RANK_EVICTED: "a rank or node was removed (`rank`, `host`, `cause`)",
    EventKind.RANK_JOINED: "a rank (hot spare, repaired node) joined (`rank`, `host`)",
    EventKind.WORLD_RESIZED: "elastic resize (`world_size` is the new size)",
    EventKind.PREEMPTED: "the scheduler preempted the job",
    EventKind.CUSTOM_BEGIN: "a user-labelled interval began (`label`)",
    EventKind.CUSTOM_END: "the user-labelled interval with the same `label` ended",
    EventKind.HEARTBEAT: "the rank's process is alive; `step` is the last step it recorded",
    EventKind.STRAGGLER_FLAGGED: (
        "the collector's detector flagged a persistent straggler (`label` kind:subject, `rank` "
        "and the host it ran on, or `host`; `step` the step this state of the finding was "
        "computed at, its `last_step`; `detail` the finding as JSON)"
    ),
    EventKind.GROUP_START: (
        "per-step fault tolerance (torchft): an incarnation of a replica group started "
        "(`label` the group, `time` its process start, `detail` `group_attempt`, "
        "`group_world_size`, `spare`); the job's attempt does not change"
    ),
    EventKind.GROUP_END: (
        "a replica group left (`label`, `cause`: completed, failed, evicted; `step` its last)"
    ),
    EventKind.QUORUM: (
        "a replica group's quorum changed or blocked its training thread (`label` the group, "
        "`step`, `world_size` the participating groups, `detail` `quorum_id`, "
        "`participating`, `blocked_s`: the wait ends at `time`)"
    ),
    EventKind.STEP_DISCARDED: (
        "a replica group ran `step` and did not commit it (torchft's `should_commit` false; "
        "`detail` `start_time`, `duration_s`, `quorum_id`; `time` is the step's end)"
    ),
    EventKind.HEAL_START: (
        "a replica group began receiving live state from a peer (`label`, `step` healed to, "
        "`detail` `source` replica, `transport`)"
    ),
    EventKind.HEAL_END: "the heal finished (`label`, `bytes` received, `cause` failed on error)",
}


if __name__ == "__main__":  # python -m goodlens.model.schema regenerates the tables in docs/
    print(data_model_markdown(), end="")
