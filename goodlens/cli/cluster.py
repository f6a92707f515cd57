"""``goodlens simulate cluster``: what gang scheduling, topology-aware placement, preemption
with checkpoints, fair share and a shared spare pool buy a cluster, in goodput and wait time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from goodlens.analysis.clusterrows import cluster_rows, format_value
from goodlens.cli.common import echo_json, overrides, table, user_message

_SETTABLE = ("nodes", "gpus_per_node", "nodes_per_rack", "racks_per_pod", "duration_s",
             "rack_cost", "pod_cost", "n_jobs", "arrival_s", "work_median_s", "work_sigma",
             "work_max_s", "step_s", "params_per_gpu", "ckpt_mode", "writer_bw", "storage_bw",
             "min_interval_s", "max_interval_s", "reserve_after_s", "estimate_factor",
             "preempt_after_s", "preempt_exempt_s", "partial_timeout_s", "fair_half_life_s",
             "aging_s", "priority_weight", "sample_every_s")


def _config(preset: str, sets: tuple[str, ...]) -> Any:
    from goodlens.analysis.clustersim.config import get_cluster_preset
    try:
        cfg = get_cluster_preset(preset)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--preset") from None
    kw = overrides(sets, type(cfg), _SETTABLE)
    try:
        return replace(cfg, **kw)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(user_message(str(exc)), param_hint="--set") from None


def _policy(spec: str, hint: str) -> Any:
    from goodlens.analysis.clustersim.config import Policy
    try:
        return Policy.parse(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _pct(v: float | None) -> str:
    return format_value(v, "share")


def _dur(v: float | None) -> str:
    return format_value(v, "seconds")


def _nh(v: float | None) -> str:
    return format_value(v, "node_s")


def _headline(results: list[dict[str, Any]]) -> str:
    """The side-by-side table: the rows, values and ``B - A`` of the dashboard's cluster
    page (:mod:`goodlens.analysis.clusterrows`, one definition for both)."""
    two = len(results) == 2
    rows = cluster_rows(results[0]["cluster"], results[1]["cluster"] if two else None)
    cols = [("label", "cluster"), ("a", "A" if two else "value")]
    if two:
        cols += [("b", "B"), ("delta", "B - A")]
    return table(rows, cols)


def _owners(r: dict[str, Any]) -> str:
    rows = [{"o": name, "s": _pct(o["share_target"]), "u": _pct(o["share_used"]),
             "j": f"{o['done']}/{o['jobs']}", "w": _dur(o["mean_wait_s"]),
             "p": _dur(o["p95_wait_s"]), "x": _dur(o["max_wait_s"])}
            for name, o in r["owners"].items()]
    return table(rows, [("o", "owner"), ("s", "share"), ("u", "used"), ("j", "done/jobs"),
                        ("w", "mean wait"), ("p", "p95 wait"), ("x", "max wait")])


def _buckets(r: dict[str, Any]) -> str:
    from goodlens.analysis.accounting import BUCKETS
    ns = r["cluster"]["node_seconds"]
    vals = {b: ns["productive"] if b == "productive" else ns[f"job_{b}"] for b in BUCKETS}
    total = sum(vals.values()) or 1.0
    rows = [{"b": b, "t": _nh(v), "p": f"{100 * v / total:5.1f}%"} for b, v in vals.items()]
    return table(rows, [("b", "job time by bucket"), ("t", "node-hours"), ("p", "share")])


@click.command("cluster")
@click.option("--preset", default="test-64", show_default=True,
              help="Named cluster and job stream: test-64, demo-256, bench-1k.")
@click.option("--policy", "policy_spec", default="baseline", show_default=True,
              metavar="SPEC",
              help="Comma-separated levers: gang|partial, topo|random, "
                   "ckpt-preempt|kill-preempt|no-preempt, fair|fifo, spares=N; unnamed ones "
                   "keep the defaults (gang,random,no-preempt,fifo,spares=0).")
@click.option("--compare", "compare_spec", metavar="SPEC",
              help="A second policy to run on the same jobs and failures, side by side.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change one cluster setting (repeatable), e.g. --set nodes=512 "
                   "--set duration_s=14d --set n_jobs=300. Durations accept 90s, 5m, 24h.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Same seed, same jobs, failures and result.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable output (seconds): the whole result (per job, per owner, "
                   "per cluster, preemptions, attempts, hourly timeline); with --compare "
                   "{seed, a, b, metrics}.")
def cluster(preset: str, policy_spec: str, compare_spec: str | None, sets: tuple[str, ...],
            seed: int, as_json: bool) -> None:
    """What-if for a cluster's scheduler: a stream of jobs (sizes, work, priorities, owners)
    on nodes in racks and pods, with node failures, under gang or partial allocation,
    topology-aware or random placement, preemption by kill or with a checkpoint, fair share
    or FIFO and a shared hot-spare pool. Prints utilisation, goodput-weighted utilisation,
    waits by owner and the longest starvation; each job's breakdown is in --json.
    """
    from goodlens.analysis.clustersim.sim import compare, simulate_cluster
    cfg = _config(preset, sets)
    pol_a = _policy(policy_spec, "--policy")
    if compare_spec is not None:
        pol_b = _policy(compare_spec, "--compare")
        doc = compare(cfg, pol_a, pol_b, seed)
        results = [doc["a"], doc["b"]]
        if as_json:
            echo_json(doc)
            return
    else:
        results = [simulate_cluster(cfg, pol_a, seed).to_dict()]
        if as_json:
            echo_json(results[0])
            return
    click.echo(f"{preset}: {cfg.describe()}, seed {seed}")
    for i, r in enumerate(results):
        tag = ("A", "B")[i] + ": " if len(results) == 2 else "policy "
        click.echo(f"{tag}{r['policy']} ({r['cluster']['events']:,} events)")
    click.echo()
    click.echo(_headline(results))
    for i, r in enumerate(results):
        click.echo()
        if len(results) == 2:
            click.echo(f"{('A', 'B')[i]}: {r['policy']}")
        click.echo(_owners(r))
        click.echo()
        click.echo(_buckets(r))
