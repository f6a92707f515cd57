"""``goodlens plan``: what each checkpoint costs, the best interval, elastic and hot-spare
choices, from first principles or from a stored run's own measurements.
"""

from __future__ import annotations

from typing import Any, NoReturn

import click

from goodlens.cli.common import (
    CollectorUrl,
    Duration,
    StoreSpec,
    echo_json,
    read_token,
    table,
    token_options,
    user_message,
)
from goodlens.model.jsonable import plain
from goodlens.model.units import format_duration, parse_bytes


def _bytes_per_s(text: str) -> float:
    """``2GB/s``, ``500MB/s``, ``1e9``: bytes per second."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


#: The planners' input names as the options of `goodlens plan` that set them.
_OPTIONS = {
    "checkpoint_cost_s": "--checkpoint-cost", "durable_stall_s": "--checkpoint-cost",
    "mtbf_s": "--mtbf", "restart_cost_s": "--restart-cost", "memory_stall_s": "--memory-stall",
    "memory_survivable": "--memory-survives", "params": "--params", "gpus": "--gpus",
    "writer_ranks": "--writers", "writer_bw": "--writer-bw", "storage_bw": "--storage-bw",
    "retained": "--retained", "price_per_gpu_hour": "--price", "interval_s": "--interval",
    "optimizer": "--optimizer", "nodes": "--nodes", "lost": "--lost",
    "micro_batch": "--micro-batch", "global_batch": "--global-batch",
    "max_micro_per_rank": "--max-micro", "gpus_per_node": "--gpus-per-node",
    "repair_s": "--repair", "horizon_s": "--repair", "node_mtbf_s": "--node-mtbf",
    "swap_s": "--swap", "spare_swap_s": "--swap", "restart_s": "--restart-cost",
    "reconfig_s": "--reconfig", "step_s": "--step", "detect_s": "--detect",
    "spares": "--spares", "replica_groups": "--replica-groups",
    "min_replicas": "--min-replicas", "quorum_s": "--quorum", "heal_s": "--heal",
    "group_restart_s": "--group-restart", "spare_groups": "--spare-groups"}


def _fail(exc: ValueError) -> NoReturn:
    raise click.UsageError(user_message(str(exc), _OPTIONS)) from None


def _out(obj: Any, as_json: bool, text: str) -> None:
    if as_json:
        echo_json(plain(obj))
    else:
        click.echo(text)


@click.group(invoke_without_command=True)
@click.option("--db", "--store", "db", type=StoreSpec(exists=True),
              help="Measured mode: a store file (no collector may hold it).")
@click.option("--url", type=CollectorUrl(),
              help="Measured mode: a running collector to read the run from instead.")
@token_options("token for --url")
@click.option("--run", "run_id", help="Measured mode: the run to measure.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
@click.pass_context
def plan(ctx: click.Context, db: str | None, url: str | None, token: str | None,
         token_file: str | None, run_id: str | None, as_json: bool) -> None:
    """Plan checkpoints, intervals, elastic and spare policies; with --run and --db (or
    --url), from the run's own costs: "checkpointing every 23 min instead of 60 would have
    recovered ..."."""
    if ctx.invoked_subcommand is not None:
        return
    if not (db or url or run_id):
        click.echo(ctx.get_help())
        return
    if not ((db or url) and run_id):
        raise click.UsageError("measured mode needs both --run ID and --db PATH (or --url URL)")
    from goodlens.analysis.measured import measure_run
    from goodlens.cli.remote import one_source, read_run_at
    one_source(db, url)
    m = read_run_at(db, url, read_token(token, token_file), run_id, measure_run)
    d = m.as_dict()
    d["summary"] = m.sentence()
    def fmt(v: float | None) -> str:
        return "-" if v is None else format_duration(v)
    lo_hi = (f" (90% CI {fmt(m.mtbf_ci_s[0])} - {fmt(m.mtbf_ci_s[1])})"
             if m.mtbf_ci_s else "")
    text = "\n".join([
        f"run {run_id}: {m.failures} failure(s) in {format_duration(m.uptime_s)} of uptime; "
        f"MTBF {fmt(m.mtbf_s)}{lo_hi}",
        f"checkpoints: {m.checkpoints}, every {fmt(m.interval_s)}, stalling "
        f"{fmt(m.checkpoint_stall_s)} each; restore {fmt(m.restore_s)}; restart "
        f"{fmt(m.restart_cost_s)} per failure",
        m.sentence()])
    _out(d, as_json, text)


@plan.command("interval")
@click.option("--checkpoint-cost", type=Duration(), required=True,
              help="Training stall of one checkpoint (e.g. 5m, 40s).")
@click.option("--mtbf", type=Duration(), required=True,
              help="The whole job's mean time between failures (node MTBF / nodes).")
@click.option("--restart-cost", type=Duration(), default="0s", show_default=True,
              help="Detection, queue, init, restore and warm-up per failure (report's "
                   "restart; not the first start-up).")
@click.option("--memory-stall", type=Duration(),
              help="Tiered: stall of an in-memory peer copy; plans a fast and a durable tier.")
@click.option("--memory-survives", type=click.FloatRange(0, 1), default=0.9, show_default=True,
              help="Tiered: share of failures the peer copy survives (single-node losses).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def plan_interval(checkpoint_cost: float, mtbf: float, restart_cost: float,
                  memory_stall: float | None, memory_survives: float, as_json: bool) -> None:
    """The checkpoint interval: Young's sqrt(2 C M), Daly's, and the first-order optimum
    with the goodput expected at each; with --memory-stall, the best pair of intervals for
    an in-memory peer tier and the durable tier."""
    from goodlens.analysis.planner import interval_plan, tiered_plan
    try:
        p = interval_plan(checkpoint_cost, mtbf, restart_cost_s=restart_cost)
        tp = (tiered_plan(memory_stall, checkpoint_cost, mtbf, memory_survives,
                          restart_cost_s=restart_cost) if memory_stall is not None else None)
    except ValueError as exc:
        _fail(exc)
    if tp is not None:
        text = (f"tiered: memory copy every {format_duration(tp.memory_interval_s)}, durable "
                f"every {format_duration(tp.durable_interval_s)}: expected goodput "
                f"{100 * tp.goodput:.2f}% (single tier at its best: "
                f"{100 * tp.single_tier_goodput:.2f}%)")
        _out({"single_tier": plain(p), "tiered": plain(tp)}, as_json, text)
        return
    rows = [{"what": name, "i": format_duration(v),
             "g": f"{100 * p.expected_goodput(v):.2f}%"}
            for name, v in (("Young", p.young_interval_s), ("Daly", p.daly_interval_s),
                            ("best (first order)", p.best_interval_s))]
    _out(p, as_json, table(rows, [("what", "interval"), ("i", "every"),
                                  ("g", "expected goodput")]))


@plan.command("checkpoint")
@click.option("--params", type=float, required=True, help="Model parameters, e.g. 70e9.")
@click.option("--optimizer", default="mixed-adam", show_default=True,
              type=click.Choice(["mixed-adam", "fp32-adam", "sgd", "weights-bf16"]),
              help="Saved training state per parameter.")
@click.option("--gpus", type=int, required=True, help="GPUs in the job.")
@click.option("--writers", type=int, help="Ranks writing shards (default: one per GPU).")
@click.option("--writer-bw", default="2GB/s", show_default=True,
              help="Write bandwidth of one writer.")
@click.option("--storage-bw", default="100GB/s", show_default=True,
              help="Aggregate bandwidth of the storage system.")
@click.option("--interval", type=Duration(), help="Checkpoint interval (for per-day costs).")
@click.option("--retained", type=int, default=2, show_default=True,
              help="Checkpoints kept on storage.")
@click.option("--price", type=float, help="Price per GPU-hour (money per checkpoint and day).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def plan_checkpoint(params: float, optimizer: str, gpus: int, writers: int | None,
                    writer_bw: str, storage_bw: str, interval: float | None, retained: int,
                    price: float | None, as_json: bool) -> None:
    """What one checkpoint costs: size, stall (sync, async snapshot, peer copy), write time,
    storage, bandwidth, GPU-hours per checkpoint and per day."""
    from goodlens.analysis.ckptcost import CheckpointSpec, checkpoint_cost
    try:
        spec = CheckpointSpec.for_optimizer(
            optimizer, params=params, gpus=gpus, writer_ranks=writers or gpus,
            writer_bw=_bytes_per_s(writer_bw), storage_bw=_bytes_per_s(storage_bw),
            retained=retained, price_per_gpu_hour=price)
        c = checkpoint_cost(spec, interval)
    except ValueError as exc:
        _fail(exc)
    lines = [f"size {c.size_bytes / 1e12:.2f} TB ({c.shard_bytes / 1e9:.2f} GB per writer); "
             f"storage for {retained}: {c.storage_bytes / 1e12:.2f} TB",
             f"stall: synchronous {format_duration(c.sync_stall_s)}, asynchronous "
             f"{format_duration(c.async_stall_s)}, peer copy "
             f"{format_duration(c.peer_copy_stall_s)}; background write "
             f"{format_duration(c.background_write_s)}",
             f"GPU-hours per checkpoint: sync {c.gpu_hours_per_checkpoint['sync']:.1f}, async "
             f"{c.gpu_hours_per_checkpoint['async']:.2f}"]
    if c.money_per_checkpoint is not None:
        lines.append(f"cost per checkpoint at {price:g} per GPU-hour: sync "
                     f"{c.money_per_checkpoint['sync']:,.2f}, async "
                     f"{c.money_per_checkpoint['async']:,.2f}, peer copy "
                     f"{c.money_per_checkpoint['peer']:,.2f}")
    if interval:
        lines.append(f"per day at every {format_duration(interval)}: "
                     f"{c.checkpoints_per_day:.0f} checkpoints, sustained "
                     f"{c.sustained_bw / 1e9:.2f} GB/s")
        if c.money_per_day is not None:
            lines.append(f"cost per day: sync {c.money_per_day['sync']:,.2f}, async "
                         f"{c.money_per_day['async']:,.2f}, peer copy "
                         f"{c.money_per_day['peer']:,.2f}")
    _out(c, as_json, "\n".join(lines))


@plan.command("elastic")
@click.option("--nodes", type=int, required=True, help="Nodes in the job.")
@click.option("--lost", type=int, required=True, help="Nodes lost (per failure).")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--micro-batch", type=int, required=True, help="Micro-batch per replica.")
@click.option("--global-batch", type=int, required=True, help="Global batch (samples).")
@click.option("--max-micro", type=int, help="Largest micro-batch a replica can hold.")
@click.option("--repair", type=Duration(), default="4h", show_default=True,
              help="Time until the lost nodes are back.")
@click.option("--mtbf", type=Duration(),
              help="The whole job's MTBF: compare restart, shrink, spares and per-step "
                   "fault tolerance under repeated failures (measured with --run).")
@click.option("--step", type=Duration(), default="10s", show_default=True,
              help="Step time of the full world.")
@click.option("--detect", type=Duration(), default="60s", show_default=True,
              help="Failure to detection (measured with --run).")
@click.option("--interval", type=Duration(), default="30m", show_default=True,
              help="Checkpoint interval (restart-based policies redo half of it).")
@click.option("--checkpoint-cost", type=Duration(), default="0s", show_default=True,
              help="Training stall of one checkpoint.")
@click.option("--restart-cost", type=Duration(), default="15m", show_default=True,
              help="A full restart: queue, init, restore, warm-up.")
@click.option("--swap", type=Duration(), default="5m", show_default=True,
              help="A restart with a hot spare node swapped in.")
@click.option("--reconfig", type=Duration(), default="2m", show_default=True,
              help="Shrink (or grow back) reconfiguration.")
@click.option("--spares", type=int, default=0, show_default=True,
              help="Hot spare nodes (the spares policy is compared when >= --lost).")
@click.option("--replica-groups", type=int,
              help="Per-step fault tolerance (torchft): replica groups (measured with --run).")
@click.option("--min-replicas", type=int, default=1, show_default=True,
              help="Per-step: fewest groups that go on training.")
@click.option("--quorum", type=Duration(), default="5s", show_default=True,
              help="Per-step: blocked time of one quorum change (measured with --run).")
@click.option("--group-restart", type=Duration(), default="5m", show_default=True,
              help="Per-step: a failed group's detection to ready to heal (measured with "
                   "--run).")
@click.option("--heal", type=Duration(), default="2s", show_default=True,
              help="Per-step: one heal from a peer (measured with --run).")
@click.option("--spare-groups", type=int, default=0, show_default=True,
              help="Per-step: hot spare replica groups.")
@click.option("--db", "--store", "db", type=StoreSpec(exists=True),
              help="Measured mode: the store holding --run (a torchft run).")
@click.option("--url", type=CollectorUrl(), help="Measured mode: a collector holding --run.")
@token_options("token for --url")
@click.option("--run", "run_id",
              help="Measured mode: take heal time, quorum cost, detection, group restart, "
                   "replica groups and the MTBF from this torchft run's report.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
@click.pass_context
def plan_elastic(ctx: click.Context, nodes: int, lost: int, gpus_per_node: int,
                 micro_batch: int, global_batch: int, max_micro: int | None, repair: float,
                 mtbf: float | None, step: float, detect: float, interval: float,
                 checkpoint_cost: float, restart_cost: float, swap: float, reconfig: float,
                 spares: int, replica_groups: int | None, min_replicas: int, quorum: float,
                 group_restart: float, heal: float, spare_groups: int, db: str | None,
                 url: str | None, token: str | None, token_file: str | None,
                 run_id: str | None, as_json: bool) -> None:
    """When k of N nodes are lost: the gradient accumulation that keeps the global batch,
    throughput on N-k, against waiting for a hot spare and a full restart. With --mtbf (or
    --run): restart, shrink, spares and per-step fault tolerance side by side, each
    failure's lost time and GPU-hours and the goodput (wall-clock, GPU-time, samples)."""
    from goodlens.analysis.planner import elastic_plan

    opts: dict[str, Any] = {"mtbf": mtbf, "detect": detect, "quorum": quorum,
                            "group_restart": group_restart, "heal": heal,
                            "replica_groups": replica_groups}
    measured = None
    if db or url or run_id:
        measured, ft_groups = _measured_ft(db, url, read_token(token, token_file), run_id)
        found = {"mtbf": measured.mtbf_s, "detect": measured.detect_s,
                 "quorum": measured.quorum_s, "group_restart": measured.group_restart_s,
                 "heal": measured.heal_s, "replica_groups": ft_groups}
        for name, value in found.items():
            # a measured value replaces an option left at its default, never one given
            given = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
            if value is not None and not given:
                opts[name] = value
        if opts["mtbf"] is None:
            raise click.UsageError(f"run {run_id} recorded no group failure to measure an "
                                   "MTBF from; give --mtbf")
    try:
        p = elastic_plan(nodes, lost, micro_batch, global_batch, gpus_per_node=gpus_per_node,
                         max_micro_per_rank=max_micro, repair_s=repair, restart_s=restart_cost,
                         spare_swap_s=swap, reconfig_s=reconfig, mtbf_s=opts["mtbf"],
                         step_s=step, detect_s=opts["detect"], interval_s=interval,
                         checkpoint_cost_s=checkpoint_cost, spares=spares,
                         replica_groups=opts["replica_groups"], min_replicas=min_replicas,
                         quorum_s=opts["quorum"], group_restart_s=opts["group_restart"],
                         heal_s=opts["heal"], spare_groups=spare_groups)
    except ValueError as exc:
        _fail(exc)
    lost_rows = [{"o": k, "h": f"{v:,.1f}"} for k, v in p.lost_gpu_hours.items()]
    lines = [
        f"{p.data_parallel} -> {p.data_parallel_used} replicas: micro-batch {p.micro_batch} x "
        f"{p.accumulation} accumulation steps = global batch {p.global_batch}"
        + ("" if p.exact else f" (not exact: {p.reason}; closest {p.closest_batch})"),
        f"throughput {100 * p.throughput_fraction:.1f}% of full", "",
        table(lost_rows, [("o", "option"), ("h", "lost GPU-hours")]), "",
        f"recommendation: {p.recommendation}"]
    if p.policies:
        rows = [{"p": k, "l": format_duration(v.lost_s_per_failure),
                 "h": f"{v.lost_gpu_hours_per_failure:,.1f}", "g": f"{100 * v.goodput:.2f}%",
                 "t": f"{100 * v.gpu_time_goodput:.2f}%", "s": f"{100 * v.sample_goodput:.2f}%"}
                for k, v in p.policies.items()]
        lines += ["", f"under failures every {format_duration(opts['mtbf'])} (job MTBF):",
                  table(rows, [("p", "policy"), ("l", "job lost/failure"),
                               ("h", "GPU-h lost/failure"), ("g", "goodput"),
                               ("t", "GPU-time"), ("s", "samples")]),
                  f"best GPU-time goodput: {p.best_policy}"]
    doc: dict[str, Any] = plain(p)
    if measured is not None:
        m = measured
        doc["measured"] = plain(m)

        def fmt(v: float | None) -> str:
            return "-" if v is None else format_duration(v)
        bw = "" if m.heal_bandwidth_Bps is None else f" ({m.heal_bandwidth_Bps / 1e9:.2f} GB/s)"
        lines += ["", f"measured from run {run_id}: {m.failures} group failure(s), "
                      f"{m.heals} heal(s) of {fmt(m.heal_s)}{bw}, quorum {fmt(m.quorum_s)} "
                      f"per change ({m.quorum_changes}), detection {fmt(m.detect_s)}, "
                      f"group restart {fmt(m.group_restart_s)}"]
    _out(doc, as_json, "\n".join(lines))


def _measured_ft(db: str | None, url: str | None, token: str | None,
                 run_id: str | None) -> tuple[Any, int | None]:
    """The per-step costs of a torchft run (:func:`goodlens.analysis.planner.measured_per_step`
    over its report's ``fault_tolerance`` section) and its replica groups."""
    if not ((db or url) and run_id):
        raise click.UsageError("measured mode needs both --run ID and --db PATH (or --url URL)")
    from goodlens.analysis.planner import measured_per_step
    from goodlens.analysis.report import report_dict
    from goodlens.cli.remote import one_source, read_run_at
    one_source(db, url)
    rep = read_run_at(db, url, token, run_id, lambda store, rid: report_dict(store, rid))
    ft = rep.get("fault_tolerance")
    if not ft:
        raise click.UsageError(f"run {run_id} has no fault_tolerance section in its report "
                               "(not a torchft run)")
    groups = ft.get("replica_groups")
    return measured_per_step(ft, rep.get("wall_clock_s")), (int(groups) if groups else None)


@plan.command("spares")
@click.option("--nodes", type=int, required=True, help="Nodes in the job.")
@click.option("--node-mtbf", type=Duration(), required=True, help="One node's MTBF, e.g. 250d.")
@click.option("--repair", type=Duration(), default="4h", show_default=True,
              help="Time to repair a failed node.")
@click.option("--swap", type=Duration(), default="5m", show_default=True,
              help="Time to swap a hot spare in.")
@click.option("--restart-cost", type=Duration(), default="15m", show_default=True,
              help="Time lost per failure without a spare (queue, init, restore).")
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
def plan_spares(nodes: int, node_mtbf: float, repair: float, swap: float,
                restart_cost: float, gpus_per_node: int, as_json: bool) -> None:
    """How many hot spares minimise lost GPU-time, counting the spares' own idle cost."""
    from goodlens.analysis.planner import spares_plan
    try:
        p = spares_plan(nodes, node_mtbf, repair, swap, restart_cost,
                        gpus_per_node=gpus_per_node)
    except ValueError as exc:
        _fail(exc)
    rows = [{"s": r["spares"], "t": f"{r['total_gpu_hours']:,.1f}"} for r in p.table[:12]]
    text = (f"{p.failures_per_day:.2f} failures a day; best: {p.best_spares} spare node(s), "
            f"{p.best_lost_gpu_hours_per_day:,.1f} GPU-hours lost a day\n\n"
            + table(rows, [("s", "spares"), ("t", "lost GPU-hours/day")]))
    _out(p, as_json, text)
