"""Benchmark: what each framework integration (FSDP2, Lightning, Hugging Face ``Trainer``)
costs per step, paired against the same job without goodlens.

Each framework's job (``examples/integrations/train_<name>.py``) runs under torchrun (gloo,
CPU, ``--nproc`` ranks; 2 puts one rank on each core of a 2-core machine) in pairs: with
goodlens (the callback or ``instrument``, the exporter pushing to a discard sink at the
lowest CPU priority, as ``bench/torch_overhead.py``'s in-process row) and with
``--no-goodlens`` (the same job, no callback, a disabled exporter). The order alternates
from pair to pair so drift hits both alike. Rank 0 writes each step's wall time; per run the
median step after the first ``--skip`` steps; per pair the ratio of the two medians. The
table gives the median of the pairs' overheads with a 95% bootstrap interval over pairs.

Target (#27): <= 1% per framework. ``met`` when the interval's upper end is <= 1%,
``unresolved`` when only the point estimate is (the machine's noise is wider than the
target), else ``over``. Beside it, the paired difference in rank 0's process CPU time per
step (every thread's: the callback or timers on the training thread and the exporter's
flusher), as a share of the plain step's wall time: what goodlens itself executes, which
the scheduler's noise between separate jobs barely moves.

    .venv/bin/python bench/integrations.py [--frameworks fsdp2,lightning,hf] [--pairs 6]
        [--steps 300] [--nproc 2] [--compute-ms 20]

``--in-process`` pairs the two arms inside one process instead
(``bench/_framework_fits.py``: a world-1 gloo group, every step timed by the job's own
code), step by step as ``bench/torch_modes.py`` does: FSDP2's arms are two alike sharded
models in one loop; Lightning's and the Trainer's are one fit whose callback and wrappers
are taken out and put back between steps (DDP's exposed-wait hooks, measured by
``bench/torch_modes.py``, and the flusher thread stay in both arms). Steps alternate in
pairs (gl, plain; plain, gl; ...), and each arm's ``--pairs`` x ``--steps`` steps are cut
into ``--pairs`` blocks. Per block: the goodlens arm's median step over the plain arm's
(wall), the difference of the median training-thread CPU per step and of the mean process
CPU per step, as shares of the plain arm's median step; medians over blocks with 95%
bootstrap intervals, and the wall column's verdict. Beside them, a last goodlens fit runs
under a profiler that sums the CPU time of goodlens's own frames on the training thread
(``_framework_fits.SelfTime``: the framework's code, the collective and the garbage
collector left out, the profiler's own per-event cost calibrated on a frame of known cost
and subtracted), and the flusher thread's clock gives its CPU per step (in the alternating
run, whose flusher wakes as often for half the rows): their sum over the plain step bounds
what goodlens executes per step from above (the profiler's leftover cost per event and the
flusher's halved rows both count against goodlens):

    .venv/bin/python bench/integrations.py --in-process [--pairs 8] [--steps 150]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import free_port, machine, table  # noqa: E402
from bench.torch_overhead import Sink  # noqa: E402

SCRIPTS = {"fsdp2": "train_fsdp2.py", "lightning": "train_lightning.py", "hf": "train_hf.py"}


def one_run(tmp: Path, script: str, url: str | None, args: argparse.Namespace,
            tag: str) -> tuple[float, float]:
    """Rank 0's median step wall time (s) of one torchrun and its process CPU time per step
    (s: every thread's, the exporter's flusher included), the first ``skip`` steps left
    out."""
    times = tmp / f"{tag}.txt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.nproc}", str(ROOT / "examples" / "integrations" / script),
           "--steps", str(args.steps), "--compute-ms", str(args.compute_ms), "--run-id", tag,
           "--times-out", str(times), "--ckpt-dir", str(tmp / f"ckpt-{tag}"),
           "--flush-interval", str(args.flush_interval)]
    cmd += ["--url", url] if url else ["--no-goodlens"]
    env = {**os.environ, "GOODLENS_SPILL_DIR": str(tmp / "spill"), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, cwd=tmp, timeout=900, capture_output=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{script} failed:\n{out.stdout.decode()[-3000:]}"
                           f"{out.stderr.decode()[-3000:]}")
    rows = [line.split() for line in times.read_text().splitlines()][args.skip:]
    wall = [float(r[0]) for r in rows]
    cpu = (float(rows[-1][1]) - float(rows[0][1])) / (len(rows) - 1)
    return statistics.median(wall), cpu


def median_ci(x: np.ndarray, seed: int = 0, n_boot: int = 4000) -> tuple[float, float, float]:
    """Median of ``x`` with a 95% bootstrap interval."""
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(x, size=(n_boot, len(x)), replace=True), axis=1)
    return float(np.median(x)), float(np.quantile(boots, 0.025)), float(np.quantile(boots,
                                                                                     0.975))


def verdict(ci: tuple[float, float, float], target: float = 0.01) -> str:
    return "met" if ci[2] <= target else "unresolved" if ci[0] <= target else "over"


def _pairs(name: str, sink: Sink, args: argparse.Namespace
           ) -> Iterator[dict[bool, np.ndarray]]:
    """Per pair, each arm's steps (``{goodlens on: rows}``), from one run whose steps
    alternate between the arms (``bench/_framework_fits.py``: ``fsdp2_interleaved``,
    ``lightning_alternating``, ``hf_alternating``), cut into ``--pairs`` blocks of
    ``--steps`` per arm."""
    from bench import _framework_fits as ff
    alternating = {"fsdp2": ff.fsdp2_interleaved, "lightning": ff.lightning_alternating,
                   "hf": ff.hf_alternating}[name]
    n = args.pairs * args.steps
    both = alternating(sink.url, 2 * n + args.skip, args.compute_ms, name)
    plain, on = (np.array(x[args.skip // 2:]) for x in both)
    for b in range(args.pairs):
        block = slice(b * args.steps, (b + 1) * args.steps)
        yield {False: plain[block], True: on[block]}


def in_process(args: argparse.Namespace, sink: Sink) -> list[list[str]]:
    """The table's rows from the arms alternating step by step in this process."""
    from bench._framework_fits import FITS, event_leak, world_one

    world_one(free_port())
    leak = event_leak()
    print(f"profiler: {leak * 1e6:.2f} us per event inside a goodlens frame", file=sys.stderr)
    rows = []
    for name in args.frameworks.split(","):
        fit = FITS[name]
        wall, thread, proc, plain_ms, flusher = [], [], [], [], []
        fit(sink.url, args.skip + 10, args.compute_ms, f"{name}-warm")  # imports, first use
        for i, got in enumerate(_pairs(name, sink, args)):
            base = float(np.median(got[False][:, 0]))
            plain_ms.append(base * 1e3)
            wall.append(float(np.median(got[True][:, 0])) / base - 1.0)
            # the training thread's goodlens work is in every step: medians, robust to a
            # step that another process's burst slowed; the flusher's is in one step a
            # second: means
            thread.append((np.median(got[True][:, 1]) - np.median(got[False][:, 1])) / base)
            proc.append((got[True][:, 2].mean() - got[False][:, 2].mean()) / base)
            # (interleaved, the flusher also runs during the plain arm's steps)
            flusher.append(float(got[True][:, 4].mean() + got[False][:, 4].mean()))
            print(f"{name} pair {i}: plain {base * 1e3:.2f} ms, wall {wall[-1]:+.2%}, "
                  f"thread CPU {thread[-1]:+.2%}, process CPU {proc[-1]:+.2%}",
                  file=sys.stderr)
        cw, ct, cp = (median_ci(np.array(v)) for v in (wall, thread, proc))
        # what goodlens itself executes: its frames on the training thread (one profiled
        # fit) and its flusher thread (the unprofiled goodlens fits), per step
        att = np.array(fit(sink.url, args.steps, args.compute_ms, f"{name}-attr",
                           attribute=True)[args.skip:])
        own = float(np.mean(att[:, 3]) - leak * np.mean(att[:, 5]))
        flush = float(np.median(flusher))
        print(f"{name}: goodlens frames {np.mean(att[:, 3]) * 1e6:.0f} us a step as "
              f"profiled, {np.mean(att[:, 5]):.0f} events inside them", file=sys.stderr)
        base = statistics.median(plain_ms) / 1e3
        share = (own + flush) / base
        rows.append([name, f"{base * 1e3:.2f}",
                     f"{cw[0]:+.2%} [{cw[1]:+.2%}, {cw[2]:+.2%}]", verdict(cw),
                     f"{ct[0]:+.2%} [{ct[1]:+.2%}, {ct[2]:+.2%}]",
                     f"{cp[0]:+.2%} [{cp[1]:+.2%}, {cp[2]:+.2%}]",
                     f"{own * 1e6:.0f} + {flush * 1e6:.0f}", f"{share:.2%}"])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", default="fsdp2,lightning,hf")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=int, default=30, help="warm-up steps left out")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--flush-interval", type=float, default=1.0,
                    help="the exporter's flush interval (its default, 1 s; the tests use 0.2)")
    ap.add_argument("--in-process", action="store_true",
                    help="pair the arms inside one process (world-1 gloo), fit by fit")
    args = ap.parse_args()
    rows = []
    sink = Sink()
    if args.in_process:
        try:
            rows = in_process(args, sink)
        finally:
            sink.stop()
        print(f"{machine()}; in one process (world 1), {args.steps} steps per fit "
              f"({args.skip} skipped), {args.compute_ms:g} ms planted compute, "
              f"{args.pairs} pairs of fits")
        print(table(rows, ["framework", "plain step (ms)", "wall over plain [95% CI]",
                           "<= 1%", "training-thread CPU over plain [95% CI]",
                           "process CPU over plain [95% CI]",
                           "goodlens CPU per step: own + flusher (us)",
                           "of the step (a bound)"]))
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="gl-integrations-") as d:
            tmp = Path(d)
            for name in args.frameworks.split(","):
                script = SCRIPTS[name]
                ratios, plain, instr, cpu = [], [], [], []
                for i in range(args.pairs):
                    order = [None, sink.url] if i % 2 == 0 else [sink.url, None]
                    got = {}
                    for url in order:
                        tag = f"{name}-{i}-{'gl' if url else 'plain'}"
                        got[url is not None] = one_run(tmp, script, url, args, tag)
                    plain.append(got[False][0])
                    instr.append(got[True][0])
                    ratios.append(got[True][0] / got[False][0] - 1.0)
                    cpu.append((got[True][1] - got[False][1]) / got[False][0])
                    print(f"{name} pair {i}: plain {got[False][0] * 1e3:.2f} ms, goodlens "
                          f"{got[True][0] * 1e3:.2f} ms ({ratios[-1]:+.2%}); CPU per step "
                          f"{got[False][1] * 1e3:.2f} -> {got[True][1] * 1e3:.2f} ms",
                          file=sys.stderr)
                ci, cc = median_ci(np.array(ratios)), median_ci(np.array(cpu))
                rows.append([name, f"{statistics.median(plain) * 1e3:.2f}",
                             f"{statistics.median(instr) * 1e3:.2f}",
                             f"{ci[0]:+.2%} [{ci[1]:+.2%}, {ci[2]:+.2%}]", verdict(ci),
                             f"{cc[0]:+.2%} [{cc[1]:+.2%}, {cc[2]:+.2%}]"])
    finally:
        sink.stop()
    print(f"{machine()}; {args.nproc} ranks, {args.steps} steps ({args.skip} skipped), "
          f"{args.compute_ms:g} ms planted compute, {args.pairs} pairs")
    print(table(rows, ["framework", "plain step (ms)", "goodlens step (ms)",
                       "overhead, median [95% CI]", "<= 1%",
                       "CPU per step over plain, in % of the plain step [95% CI]"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
