"""``goodlens relay``: the per-host relay that carries the local ranks' pushes to the collector.
"""

from __future__ import annotations

import json

import click

from goodlens.cli.common import LOG_LEVELS, ByteSize, Duration


@click.command()
@click.option("--upstream", required=True, envvar="GOODLENS_URL",
              help="The collector to forward to, e.g. http://collector:8470 (GOODLENS_URL).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback requires --token.")
@click.option("--port", type=int, default=8472, show_default=True, envvar="GOODLENS_RELAY_PORT",
              help="Port to listen on (GOODLENS_RELAY_PORT; 0 picks a free one).")
@click.option("--socket", "socket_path", default=None, metavar="PATH|auto",
              help="Listen on this Unix socket (mode 0600) instead of TCP; 'auto': where "
                   "exporters with GOODLENS_RELAY=1 look for it (relay-PORT.sock in this "
                   "user's private goodlens directory). Only this user can connect.")
@click.option("--token", default=None,
              help="Token pushers must send (Authorization: Bearer T); also sent upstream. "
                   "Without it, each push's own Authorization header is passed through.")
@click.option("--upstream-token", default=None,
              help="Token for the collector when it differs from --token.")
@click.option("--window", type=Duration(), default="100ms", show_default=True,
              help="Longest a push waits for other pushes to join it (0: forward at once). "
                   "The batch goes earlier once every rank seen lately has a push waiting.")
@click.option("--max-rows", type=int, default=200_000, show_default=True,
              help="Most rows in one merged batch.")
@click.option("--max-batch", type=ByteSize(), default="16MiB", show_default=True,
              help="Most pushed bytes in one merged batch (below the collector's --max-body).")
@click.option("--max-body", type=ByteSize(), default="64MiB", show_default=True,
              help="Largest accepted push; bigger ones get 413.")
@click.option("--timeout", type=Duration(), default="2s", show_default=True,
              help="Timeout of one request to the collector. Every push is answered within "
                   "4.5 s of arriving (the exporters give up at 5 s): one that waited behind "
                   "a slow forward gets 503 (retry) rather than a late answer.")
@click.option("--idle-exit", type=Duration(), default="0", show_default=True,
              help="Exit after this long without a push (0: never).")
@click.option("--log-level", default="warning", show_default=True,
              type=LOG_LEVELS,
              help="uvicorn's log level.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the address once listening, and the counters at exit, as JSON lines.")
def relay(upstream: str, host: str, port: int, socket_path: str | None, token: str | None,
          upstream_token: str | None, window: float, max_rows: int, max_batch: int,
          max_body: int, timeout: float, idle_exit: float, log_level: str, as_json: bool) -> None:
    """Run a per-host relay: accepts the collector's POST /v1/ingest from this host's ranks,
    merges their batches of one run over a short window and forwards them upstream in one
    request over one connection.

    A push is answered 200 only after the collector acknowledged the merged batch holding
    it; while the collector is away pushes get 503, so exporters spill and retry as usual.
    A merged batch the collector refuses (4xx) or cannot store (500) is forwarded push by
    push, so each rank hears its own verdict. Exporters start one themselves with
    GOODLENS_RELAY=1 (on --socket auto). GET /healthz shows the counters.
    """
    from goodlens.collector.relay import RelayConfig
    from goodlens.collector.relay_http import serve
    from goodlens.exporter.private import UnsafePath, relay_socket

    try:
        if socket_path == "auto":
            socket_path = relay_socket(port)
        config = RelayConfig(upstream=upstream, host=host, port=port, socket=socket_path,
                             token=token,
                             upstream_token=upstream_token, window_s=window,
                             max_batch_rows=max_rows, max_batch_bytes=max_batch,
                             max_body_bytes=max_body, timeout_s=timeout, idle_exit_s=idle_exit)
    except (ValueError, UnsafePath) as exc:
        raise click.ClickException(str(exc)) from None

    def ready(bound: int) -> None:
        url = f"unix:{socket_path}" if socket_path else f"http://{host}:{bound}"
        if as_json:
            click.echo(json.dumps({"relay": url, "port": bound, "socket": socket_path,
                                   "upstream": upstream, "window_s": window}), nl=True)
        else:
            click.echo(f"goodlens relay on {url} -> {upstream} (window {window * 1e3:.0f} ms)",
                       err=True)
            click.echo(f"  push:   {url}/v1/ingest", err=True)
            click.echo(f"  health: {url}/healthz", err=True)

    try:
        done = serve(config, ready=ready, log_level=log_level)
    except (RuntimeError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    health = done.health()
    if as_json:
        click.echo(json.dumps(health))
    else:
        click.echo(f"relay stopped: {health['pushes']} pushes, {health['forwarded']} requests "
                   f"upstream, {health['forwarded_rows']} rows acknowledged, "
                   f"{health['upstream_errors']} upstream errors", err=True)
