"""Running a uvicorn server until it exits, for every server goodlens starts (the collector,
the relay, the dashboard alone): the bound port reported once it accepts connections, and a
periodic tick meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def serve_until_exit(server: Any, ready: Any = None, tick: Any = None) -> None:
    """Serve a ``uvicorn.Server`` until it exits: ``ready(port)`` once it accepts
    connections (the bound port, for port 0), ``tick()`` about every second meanwhile."""
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.02)
    if ready is not None:
        ready(server.servers[0].sockets[0].getsockname()[1])
    while tick is not None and not task.done():
        await asyncio.wait({task}, timeout=1.0)
        tick()
    # awaited directly: a SystemExit the server's signal handler raises inside the task
    # then counts as retrieved (no "Task exception was never retrieved" at exit)
    await task
