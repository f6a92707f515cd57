"""``goodlens serve`` and ``goodlens dashboard``: the composition root.

The only place that wires the collector service, the dashboard and a store together: the
collector never imports the dashboard; ``serve`` hands it a factory that builds the Dash app
over the store the collector opened and mounts it at ``/``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from goodlens.cli.common import (
    DEFAULT_PORT,
    LOG_LEVELS,
    ByteSize,
    Duration,
    StoreError,
    StoreSpec,
    detector_options,
    import_trace_file,
    open_store,
    read_token,
    straggler_config,
    token_options,
)


def _price(ctx: Any, param: Any, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter("must be a finite number >= 0")
    return value


#: ``--gpu-hour-price`` of ``serve`` and ``dashboard`` (``DashConfig.gpu_hour_price``).
gpu_hour_price_option = click.option(
    "--gpu-hour-price", type=float, metavar="FLOAT", callback=_price,
    help="Money per GPU-hour (any currency) for the dashboard's checkpoint costs; a page's "
         "?price= overrides it. Default: none (costs in GPU-hours only).")


def dashboard_root(token: str | None, live_detection: bool,
                   gpu_hour_price: float | None = None, straggler: Any = None) -> Any:
    """What ``goodlens serve`` mounts at ``/``: the dashboard over the collector's store,
    behind the collector's token (``straggler``: the detector's config, for its batch
    passes over runs the live detector did not see). ``build(store, detection)`` gets the
    collector's detection service, whose progress the ranks page reports."""
    def build(store: Any, detection: Any = None) -> Any:
        from goodlens.dashboard.app import create_app
        from goodlens.dashboard.asgi import dashboard_asgi
        from goodlens.dashboard.data import DashConfig
        config = DashConfig(live_detection=live_detection, gpu_hour_price=gpu_hour_price,
                            straggler=straggler,
                            detection_read=None if detection is None else detection.has_read)
        return dashboard_asgi(create_app(store, config), token)
    return build


def serve_dashboard(db: str, host: str = "127.0.0.1", port: int = 8471, *,
                    config: Any = None, ready: Any = None, log_level: str = "warning") -> None:
    """Serve the dashboard alone over a store opened read-only, until SIGINT/SIGTERM."""
    import asyncio
    import signal

    import uvicorn

    from goodlens.collector.serving import RequestGuard, serve_until_exit, uvicorn_config
    from goodlens.dashboard.app import create_app
    from goodlens.dashboard.asgi import dashboard_asgi
    from goodlens.exporter.transport import is_loopback

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit)
    store = open_store(db, read_only=True)
    try:
        # on loopback, only loopback Host names (no DNS rebinding from a browser's page)
        app = RequestGuard(dashboard_asgi(create_app(store, config)), body_timeout_s=60.0,
                           allowed=frozenset({host.lower()}) if is_loopback(host) else None)
        server = uvicorn.Server(uvicorn_config(app, host, port, log_level=log_level))
        if ready is None:
            server.run()
        else:
            asyncio.run(serve_until_exit(server, ready))
    finally:
        store.close()


@click.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(),
              help="DuckDB file the collector owns (created if missing), or parquet:DIR: a "
                   "Parquet dataset that several collectors can write at once.")
@click.option("--init", is_flag=True,
              help="Add goodlens's tables to an existing DuckDB file that lacks them (another "
                   "application's database); without it such a file is refused.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback requires a token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int,
              help="TCP port (0 picks a free one).")
@token_options("bearer token exporters and readers must send")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Without a token only loopback Host names (localhost, 127.0.0.1, ::1) and "
                   "the bound address are answered (421 otherwise: no DNS rebinding from a "
                   "browser); add a name (repeatable; '*': any).")
@click.option("--header-timeout", type=Duration(), default="10s", show_default=True,
              help="A connection must send a request's headers within this (closed "
                   "otherwise).")
@click.option("--body-timeout", type=Duration(), default="60s", show_default=True,
              help="A request's body must arrive within this of its headers (408 otherwise).")
@click.option("--max-connections", type=int, default=4096, show_default=True,
              help="Open connections beyond which requests get 503; a quarter may wait for "
                   "their headers at once (the oldest is closed for a new one).")
@click.option("--max-body", type=ByteSize(), default="64MiB", show_default=True,
              help="Largest accepted push.")
@click.option("--max-queue-rows", type=int, default=4_000_000, show_default=True,
              help="Rows the write queue holds before pushes get 503 (exporters back off).")
@click.option("--summarize-every", type=Duration(), default="1s", show_default=True,
              help="How often per-step summaries catch up with new rows (e.g. 500ms, 2s).")
@click.option("--memory-limit", default="2GB", show_default=True,
              help="DuckDB memory limit for the store (its cache otherwise grows with the data).")
@click.option("--detect/--no-detect", default=True, show_default=True,
              help="Run the straggler detector over live runs.")
@detector_options
@click.option("--webhook", help="URL that receives each straggler finding once (JSON POST), "
                                "e.g. a launcher that evicts.")
@click.option("--hang-floor", type=Duration(), default="60s", show_default=True,
              help="Shortest hang timeout; the timeout adapts to 3x the longest step interval.")
@click.option("--metrics-retention", type=Duration(allow_all=True), default="1h",
              show_default=True,
              help="/metrics exports runs live or active within this long (finished runs "
                   "then drop off; their history stays on /v1/report, the CLI and the "
                   "dashboard); `all` exports every run (a demo over old traces).")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True,
              help="Serve the dashboard at / (with --token, open it once as /?token=...).")
@gpu_hour_price_option
@click.option("--load", "loads", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Trace folder to import before serving (repeatable; importing twice adds "
                   "nothing).")
@click.option("--log-level", default="info", show_default=True,
              type=LOG_LEVELS)
def serve(db: str, init: bool, host: str, port: int, token: str | None,
          token_file: str | None, allow_hosts: tuple[str, ...], header_timeout: float,
          body_timeout: float, max_connections: int, max_body: int, max_queue_rows: int,
          summarize_every: float, memory_limit: str, detect: bool, threshold: float,
          min_slowdown: float, evict_at: float, webhook: str | None,
          hang_floor: float, metrics_retention: float, dashboard: bool,
          gpu_hour_price: float | None, loads: tuple[str, ...], log_level: str) -> None:
    """Run the collector: ingest on /v1/ingest, Prometheus on /metrics, health on /healthz,
    the API's OpenAPI document on /openapi.json.

    One process owns the DuckDB file (DuckDB lets no other process open it meanwhile);
    stop it with Ctrl-C or SIGTERM, which writes everything queued first.
    """
    from goodlens.collector.server import ServerConfig
    from goodlens.collector.server import serve as run_server
    from goodlens.collector.serving import Limits
    from goodlens.storage.store import NotAStore

    token = read_token(token, token_file)
    straggler = straggler_config(threshold, min_slowdown, evict_at)
    try:
        limits = Limits(header_timeout_s=header_timeout, body_timeout_s=body_timeout,
                        max_connections=max_connections)
        config = ServerConfig(db=db, host=host, port=port, token=token,
                              max_body_bytes=max_body, max_queue_rows=max_queue_rows,
                              memory_limit=memory_limit, summarize_interval_s=summarize_every,
                              detect=detect, straggler=straggler, webhook=webhook,
                              hang_floor_s=hang_floor,
                              metrics_retention_s=metrics_retention,
                              allow_hosts=allow_hosts, init=init, limits=limits)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if not db.startswith("parquet:"):
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    if loads:
        store = open_store(db, read_only=False, init=init)
        try:
            for path in loads:
                import_trace_file(store, path, quiet=False)
        finally:
            store.close()

    def ready(bound: int) -> None:
        click.echo(f"goodlens collector on http://{host}:{bound}  (db: {db})", err=True)
        click.echo(f"  push:    http://{host}:{bound}/v1/ingest", err=True)
        click.echo(f"  metrics: http://{host}:{bound}/metrics", err=True)
        if dashboard:
            click.echo(f"  dashboard: http://{host}:{bound}/", err=True)

    try:
        run_server(config, ready=ready, log_level=log_level,
                   root=dashboard_root(token, detect, gpu_hour_price, straggler)
                   if dashboard else None)
    except NotAStore as exc:
        raise StoreError(str(exc)) from None
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--db", "--store", "db", required=True, type=StoreSpec(exists=True),
              help="Store file, opened read-only (no collector may hold it; a running "
                   "collector serves the dashboard itself at its own /).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8471, show_default=True, type=int, help="Port (0: any free).")
@gpu_hour_price_option
@detector_options
@click.option("--log-level", default="warning", show_default=True,
              type=LOG_LEVELS)
def dashboard(db: str, host: str, port: int, gpu_hour_price: float | None, threshold: float,
              min_slowdown: float, evict_at: float, log_level: str) -> None:
    """Serve the dashboard alone over a store file: runs, where the wall-clock went, slow
    ranks, checkpoint costs and what-if, with the run id in each page's URL. The detector
    options tune the slow-ranks page's pass over runs no live collector scanned.
    """
    from goodlens.dashboard.data import DashConfig
    from goodlens.exporter.transport import is_loopback

    if not is_loopback(host):
        click.echo(f"warning: the dashboard on {host} has no authentication; anyone who "
                   "reaches it can read every run", err=True)

    def ready(bound: int) -> None:
        click.echo(f"goodlens dashboard on http://{host}:{bound}/  (db: {db}, read-only)",
                   err=True)
    try:
        config = DashConfig(gpu_hour_price=gpu_hour_price,
                            straggler=straggler_config(threshold, min_slowdown, evict_at))
        serve_dashboard(db, host, port, config=config, ready=ready, log_level=log_level)
    except click.ClickException as exc:  # the file is held by a collector, or not a store
        if "held by another process" in exc.message:
            raise click.ClickException(
                f"{db} is held by a running collector; open the dashboard it serves at its "
                "own URL (e.g. http://127.0.0.1:8470/) instead") from None
        raise
