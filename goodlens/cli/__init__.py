"""The ``goodlens`` command: parses, wires the library together and prints; no logic of its own.

Every command that reports numbers takes ``--json`` (seconds for every duration); durations
on the command line accept ``90s``, ``5m``, ``24h``. Commands live one concern per module
(``serve``, ``reports``, ``data``, ``sim``, ``cluster``, ``plan``, ``runs``, ``relay``,
``batch``, ``nodes``) and share ``common``; this module only assembles them, importing a
command's module when that command runs (``goodlens detect`` loads neither the server's nor the
simulators' modules). Nothing in goodlens imports the CLI.
"""

from __future__ import annotations

import importlib

import click

from goodlens import __version__

#: command name -> (module under goodlens.cli, attribute): imported on first use
_COMMANDS = {
    "serve": ("serve", "serve"), "runs": ("reports", "runs"), "report": ("reports", "report"),
    "simulate": ("sim", "simulate"), "detect": ("reports", "detect"),
    "dashboard": ("serve", "dashboard"), "import": ("data", "import_cmd"),
    "replay": ("data", "replay"), "export": ("data", "export"), "plan": ("plan", "plan"),
    "relay": ("relay", "relay"), "end-run": ("runs", "end_run"),
    "deadletter": ("deadletter", "deadletter"), "summarize": ("batch", "summarize"),
    "fleet": ("batch", "fleet"), "nodes": ("nodes", "nodes"),
}


class _LazyGroup(click.Group):
    """A group whose commands' modules are imported when a command is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            module, attr = _COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"goodlens.cli.{module}"), attr)
            if cmd_name == "simulate":
                from goodlens.cli import cluster
                command.add_command(cluster.cluster)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=_LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="goodlens")
def main() -> None:
    """goodlens: where the wall-clock of a large training run went, and what to do about it.

    Start a collector with `goodlens serve`, point exporters at it, and ask
    `goodlens runs` what it holds.

    Exit codes: 0 done; 1 it failed (the message says why and what to do); 2 a usage error,
    including a --db that is missing or not a goodlens store.
    """


__all__ = ["main"]
