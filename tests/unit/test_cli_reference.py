"""The generated reference pages agree with the code: docs/cli.md with every command's
``--help``, docs/http-api.md with the collector's OpenAPI document."""

from __future__ import annotations

from click.testing import CliRunner

from goodlens.cli import main
from goodlens.cli.docs import WIDTH, stale


def test_the_reference_pages_are_what_the_code_generates() -> None:
    diffs = stale()
    assert not diffs, ("stale reference pages; regenerate with `python -m goodlens.cli.docs`:\n"
                       + "".join(diffs.values())[:4000])


def test_the_cli_page_holds_each_commands_help_as_the_user_sees_it() -> None:
    """Independent of the generator's walk: ``goodlens CMD --help`` run as a user would, at
    the page's width, appears verbatim on the page, for every command and subcommand."""
    from goodlens.cli.docs import CLI_PAGE, ROOT
    page = (ROOT / CLI_PAGE).read_text()
    runner = CliRunner()
    commands = [[], *([c] for c in main.list_commands(None))]  # type: ignore[arg-type]
    commands += [["plan", c] for c in ("checkpoint", "interval", "elastic", "spares")]
    commands += [["deadletter", c] for c in ("list", "show", "resend", "purge")]
    commands += [["simulate", "cluster"]]
    for args in commands:
        out = runner.invoke(main, [*args, "--help"], prog_name="goodlens",
                            terminal_width=WIDTH)
        assert out.exit_code == 0, (args, out.output)
        assert out.output.rstrip() in page, f"goodlens {' '.join(args)} --help differs"
        assert f"## goodlens {' '.join(args)}".rstrip() in page
