"""``goodlens simulate``: a training run's goodput under failures, checkpoints, stragglers
and an elastic policy, by Monte Carlo over the run simulator, in the buckets of ``goodlens
report`` (``goodlens simulate cluster``, in :mod:`goodlens.cli.cluster`, simulates a whole
cluster's scheduler instead).
"""

from __future__ import annotations

import sys

import click

from goodlens.cli.common import echo_json, overrides, table, user_message
from goodlens.model.units import format_duration


@click.group(invoke_without_command=True)
@click.option("--preset", default="demo-64", show_default=True,
              help="Named configuration: llama3-16k, kokolis-1k, demo-64, test-16.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Change one setting (repeatable), e.g. --set interval_s=10m "
                   "--set elastic=spares --set spares=4, or --set elastic=per_step "
                   "--set replica_groups=4 (per-step fault tolerance). Durations accept "
                   "90s, 5m, 24h.")
@click.option("--trials", type=click.IntRange(1), default=100, show_default=True,
              help="Monte Carlo trials.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same result.")
@click.option("--sweep", "sweep_spec", metavar="FIELD=V1,V2,...",
              help="Run every value of one setting and print a table ready to plot.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Also write the first trial (of --seed) as a trace folder: per-rank step "
                   "rows, events, ground_truth.json; with --trials 1 it is the run printed. "
                   "For small runs (at most --max-rows rows).")
@click.option("--run-id", default="sim", show_default=True, help="Run id in the --out trace.")
@click.option("--max-rows", type=int, default=50_000_000, show_default=True,
              help="Refuse --out traces bigger than this many rank-step rows.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (seconds).")
@click.pass_context
def simulate(ctx: click.Context, preset: str, sets: tuple[str, ...], trials: int, seed: int,
             sweep_spec: str | None, out: str | None, run_id: str, max_rows: int,
             as_json: bool) -> None:
    """What-if: simulate a training run's goodput under failures, checkpoints, stragglers
    and an elastic policy (Monte Carlo over --trials), in the buckets of `goodlens report`.
    `goodlens simulate cluster` simulates a whole cluster's scheduler instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    from dataclasses import replace

    from goodlens.analysis.runsim import montecarlo as sim
    from goodlens.analysis.runsim.presets import get_preset
    try:
        config = replace(get_preset(preset), **overrides(sets))
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--preset") from None
    except ValueError as exc:
        raise click.BadParameter(user_message(str(exc)), param_hint="--set") from None
    if sweep_spec:
        name, _, raw = sweep_spec.partition("=")
        values = [v for v in raw.split(",") if v]
        if not values:
            raise click.BadParameter("use FIELD=V1,V2,...", param_hint="--sweep")
        typed = [next(iter(overrides((f"{name}={v}",)).values())) for v in values]
        try:
            df = sim.sweep(config, name, typed, trials=trials, seed=seed)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--sweep") from None
        if as_json:
            echo_json({"preset": preset, "field": name, "trials": trials,
                        "rows": df.to_dict("records")})
        else:
            cols = [c for c in df.columns if c == "value" or c.startswith("goodput")]
            click.echo(df[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        return
    trace_note = None
    if out and config.elastic == "per_step":
        raise click.UsageError("--out does not write elastic=per_step runs (no replica-group "
                               "events in the trace); leave --out out")
    if out:
        rows = config.duration_s / config.step_s * config.nodes * config.gpus_per_node
        if rows > max_rows:
            raise click.UsageError(
                f"--out would write about {rows:,.0f} rank-step rows (limit --max-rows "
                f"{max_rows:,}); shorten it (--set duration_s=2h) or use fewer nodes")
        from goodlens.analysis.runsim.tracegen import generate_trace
        # the first trial of the Monte Carlo below, drawn from its stream, counted as the
        # trace has it: with --trials 1 the numbers printed are the trace's
        tr = generate_trace(config, seed, out, run_id=run_id, rng=sim.trial_rng(seed, 0))
        trace_note = {"path": str(tr.path), "run_id": run_id, "seed": seed, "trial": 1,
                      "rows": tr.rows,
                      "rows_per_s": tr.rows_per_s, "truth": tr.truth}
    with click.progressbar(length=trials, label=f"simulating {preset} x{trials}",
                           file=sys.stderr, hidden=as_json or not sys.stderr.isatty()) as bar:
        res = sim.monte_carlo(config, trials=trials, seed=seed,
                              first=tr.as_result() if trace_note else None)
        bar.update(trials)
    out_doc = {"preset": preset, **res}
    if trace_note:
        out_doc["trace"] = trace_note
    out = out_doc
    if as_json:
        echo_json(out)
        return
    wall = out["wall_clock_s"]
    click.echo(f"{preset}: {config.nodes * config.gpus_per_node:,} GPUs for "
               f"{format_duration(wall)}, {trials} trials")
    samples = (f", samples {100 * out['sample_goodput_mean']:.1f}%"
               if config.elastic in ("per_step", "shrink") else "")
    click.echo(f"goodput {100 * out['goodput_mean']:.1f}% (p5 {100 * out['goodput_p5']:.1f}%, "
               f"p95 {100 * out['goodput_p95']:.1f}%), GPU-time "
               f"{100 * out['gpu_time_goodput_mean']:.1f}%{samples}\n")
    rows = []
    for b, v in out["buckets_mean"].items():
        rows.append({"b": b, "t": format_duration(v), "p": f"{100 * v / wall:5.1f}%"})
        rows += [{"b": f"  {k}", "t": format_duration(x), "p": f"{100 * x / wall:5.1f}%"}
                 for k, x in (out.get(f"{b}_parts_mean") or {}).items() if x]
    click.echo(table(rows, [("b", "bucket (mean)"), ("t", "time"), ("p", "share")]))
    if trace_note:
        click.echo(f"\ntrace of trial 1 of seed {seed}: {trace_note['path']} "
                   f"({trace_note['rows']:,} rank-step rows; its ground truth: goodput "
                   f"{100 * trace_note['truth']['goodput']:.1f}%, in ground_truth.json)")
