"""``goodlens deadletter``: the batches exporters set aside, listed, shown, re-sent or purged.

An exporter retries a batch the collector answers with a 5xx (other than 502/503/504) a few
times, and one the collector stays away for longer than its age limit; then it sets the
batch aside in a dead-letter file beside its spill file (``RUN-rankN.deadletter`` in the
spill directory) and goes on with the next one, so one batch never blocks a rank. These
commands look into those files and, once the collector is back or fixed, send the batches
again (by the exporter's own rules: a refused batch is split to keep its good rows, what
still fails stays in the file). Sending a batch twice is harmless: the store ignores rows
it already holds.
"""

from __future__ import annotations

import os
from typing import Any

import click

from goodlens.cli.common import echo_json, read_token, table, token_options


def _folder(folder: str | None) -> str:
    from goodlens.exporter.private import UnsafePath, spill_dir
    try:
        return spill_dir(folder or "auto")
    except UnsafePath as exc:
        raise click.ClickException(str(exc)) from None


def _files(folder: str, names: tuple[str, ...]) -> list[str]:
    from goodlens.exporter.spill import DEAD, dead_letter_files
    found = dead_letter_files(folder)
    if not names:
        return found
    wanted = {n if n.endswith(DEAD) else n + DEAD for n in names}
    missing = wanted - {os.path.basename(p) for p in found}
    if missing:
        raise click.ClickException(f"no dead-letter file {sorted(missing)} in {folder}")
    return [p for p in found if os.path.basename(p) in wanted]


def _records(path: str) -> list[Any]:
    from goodlens.exporter.spill import parse, read_private
    try:
        return parse(read_private(path))[0]
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from None


dir_option = click.option(
    "--dir", "folder", envvar="GOODLENS_SPILL_DIR", default=None,
    help="The exporters' spill directory (GOODLENS_SPILL_DIR; default: this user's private "
         "goodlens spill directory, as the exporters use).")


@click.group()
def deadletter() -> None:
    """Batches exporters set aside after failing too often: list, show, resend, purge.

    A batch the collector could not store (500) after the exporter's retries, or that
    waited for an absent collector past its age limit, lands in RUN-rankN.deadletter in
    the spill directory. Nothing there is sent by itself: inspect it, then resend it to a
    collector that is back, or purge it.
    """


@deadletter.command("list")
@dir_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file.")
def list_cmd(folder: str | None, as_json: bool) -> None:
    """Dead-letter files: batches, rows, bytes, oldest failure and the last reason."""
    from goodlens.exporter.spill import describe
    folder = _folder(folder)
    out = []
    for path in _files(folder, ()):
        recs = [describe(r) for r in _records(path)]
        born = [r["first_failed"] for r in recs if r["first_failed"]]
        out.append({"file": os.path.basename(path), "path": path, "batches": len(recs),
                    "rows": sum(r["rows"] for r in recs),
                    "bytes": sum(r["bytes"] for r in recs),
                    "runs": sorted({str(r.get("run_id")) for r in recs}),
                    "oldest": min(born) if born else None,
                    "statuses": sorted({r["status"] for r in recs if r["status"]}),
                    "last_reason": recs[-1]["reason"] if recs else None})
    if as_json:
        echo_json(out)
    elif not out:
        click.echo(f"no dead-letter files in {folder}")
    else:
        click.echo(table(out, [("file", "file"), ("batches", "batches"), ("rows", "rows"),
                               ("bytes", "bytes"), ("statuses", "statuses")]))
        for f in out:
            click.echo(f"{f['file']}: {f['last_reason']}")


@deadletter.command()
@dir_option
@click.argument("names", nargs=-1)
@click.option("--body", is_flag=True, help="Also print each batch as its JSON batch object.")
def show(folder: str | None, names: tuple[str, ...], body: bool) -> None:
    """The batches of dead-letter files (NAMES: file names, default all) as JSON: rows,
    tries, last status, why they were set aside, run and steps."""
    from goodlens.exporter.spill import decode_doc, describe
    folder = _folder(folder)
    out = []
    for path in _files(folder, names):
        for i, rec in enumerate(_records(path)):
            info = {"file": os.path.basename(path), "index": i, **describe(rec)}
            if body:
                try:
                    info["batch"] = decode_doc(rec.body, rec.kind)
                except (ValueError, KeyError, TypeError, OSError) as exc:
                    info["batch"] = f"undecodable: {exc}"
            out.append(info)
    echo_json(out)


@deadletter.command()
@dir_option
@click.argument("names", nargs=-1)
@click.option("--url", envvar="GOODLENS_URL", required=True,
              help="The collector to send to (GOODLENS_URL).")
@token_options("collector's token")
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait for each answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def resend(folder: str | None, names: tuple[str, ...], url: str, token: str | None,
           token_file: str | None, timeout: float, as_json: bool) -> None:
    """Send the batches of dead-letter files (NAMES, default all) to --url again.

    Delivered batches leave the file; refused ones (4xx) are dropped and counted, as the
    exporter would; those that still fail stay. Exit code 1 when some stayed.
    """
    from goodlens.exporter.spill import put_back, rows_of, take_records
    folder = _folder(folder)
    transport = _resender(url, read_token(token, token_file), timeout)
    counts = {"files": 0, "batches": 0, "delivered_rows": 0, "refused_rows": 0,
              "kept_batches": 0, "kept_rows": 0}
    away = False
    try:
        for path in _files(folder, names):
            moved, recs = take_records(path)
            counts["files"] += 1
            keep: list[Any] = []
            for rec in recs:
                counts["batches"] += 1
                rows, lost = rows_of(rec), transport.stats.lost_rows
                left: list[Any] = [rec]
                if not away:  # once nothing answers, the rest stays untried
                    transport.failed, transport._next_try = [], 0.0
                    left = transport._attempt(rec) + transport.failed
                    away = bool(left) and transport._last_status is None
                kept = sum(rows_of(r) for r in left)
                keep.extend(left)
                counts["kept_batches"] += len(left)
                counts["kept_rows"] += kept
                counts["refused_rows"] += transport.stats.lost_rows - lost
                counts["delivered_rows"] += max(0, rows - kept - (transport.stats.lost_rows
                                                                  - lost))
            put_back(path, moved, keep)
    finally:
        transport.close()
    counts["refused_batches"] = transport.stats.rejected_batches
    if as_json:
        echo_json(counts)
    else:
        click.echo(f"{counts['delivered_rows']} rows delivered, {counts['refused_rows']} "
                   f"refused by the collector (dropped), {counts['kept_batches']} batches "
                   f"({counts['kept_rows']} rows) still failing and kept; last error: "
                   f"{transport.stats.last_error or '-'}")
    if counts["kept_batches"]:
        raise SystemExit(1)


def _resender(url: str, token: str | None, timeout: float) -> Any:
    """A transport that tries each batch once and hands back what still fails."""
    from goodlens.exporter.transport import Transport

    class Resender(Transport):
        failed: list[Any]

        def _set_aside(self, rec: Any, why: str) -> None:
            rec.note = why
            self.failed.append(rec)

    transport = Resender(url, token, timeout_s=timeout, max_attempts=1, max_age_s=0)
    transport.failed = []
    return transport


@deadletter.command()
@dir_option
@click.argument("names", nargs=-1)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def purge(folder: str | None, names: tuple[str, ...], yes: bool) -> None:
    """Delete dead-letter files (NAMES, default all) and the batches in them."""
    folder = _folder(folder)
    paths = _files(folder, names)
    if not paths:
        click.echo(f"no dead-letter files in {folder}")
        return
    if not yes:
        click.confirm(f"delete {len(paths)} dead-letter file(s) in {folder}?", abort=True)
    for p in paths:
        os.unlink(p)
    click.echo(f"deleted {len(paths)} dead-letter file(s)")
