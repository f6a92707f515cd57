"""The ``goodlens`` command: parses, wires the library together and prints; no logic of its own.

Every command that reports numbers takes ``--json`` (seconds for every duration); durations
on the command line accept ``90s``, ``5m``, ``24h``. Commands live one concern per module
(``serve``, ``reports``, ``data``, ``sim``, ``cluster``, ``plan``, ``runs``, ``relay``) and
share ``common``; this module only assembles them. Nothing in goodlens imports the CLI.
"""

from __future__ import annotations

import click

from goodlens import __version__
from goodlens.cli import cluster, data, plan, relay, reports, runs, serve, sim
from goodlens.cli.deadletter import deadletter as _deadletter


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="goodlens")
def main() -> None:
    """goodlens: where the wall-clock of a large training run went, and what to do about it.

    Start a collector with `goodlens serve`, point exporters at it, and ask
    `goodlens runs` what it holds.

    Exit codes: 0 done; 1 it failed (the message says why and what to do); 2 a usage error,
    including a --db that is missing or not a goodlens store.
    """


for _command in (serve.serve, reports.runs, reports.report, sim.simulate, reports.detect,
                 serve.dashboard, data.import_cmd, data.replay, data.export, plan.plan,
                 relay.relay, runs.end_run, _deadletter):
    main.add_command(_command)
sim.simulate.add_command(cluster.cluster)

__all__ = ["main"]
