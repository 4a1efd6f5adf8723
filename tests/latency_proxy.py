"""A TCP proxy on 127.0.0.1 that delays every byte by a fixed time in each direction (the latency tier).

Put it in front of a local S3 server and every request pays what it pays on a real network: a small GET
costs one round trip (``2 * one_way_s``), a client that waits for ``100 Continue`` before sending a body
pays two, a new connection pays its handshake. Bandwidth is not limited; data are delayed, not throttled,
and each direction keeps its byte order (a pipelined link, like a long cable).

Used by ``tests/bench_round_trips.py`` and the latency tier of the tests::

    with LatencyProxy("127.0.0.1", seaweed_port, one_way_s=0.0125) as proxy:
        endpoint = proxy.endpoint  # http://127.0.0.1:<port>
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any


class LatencyProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port``, delaying each direction by
    ``one_way_s``. Runs its own event loop in a daemon thread; :meth:`stop` closes every connection."""

    def __init__(self, target_host: str, target_port: int, one_way_s: float) -> None:
        self.target = (target_host, target_port)
        self.one_way_s = one_way_s
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LatencyProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self.port = fut.result(10)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        # The handshake of a new connection costs a round trip on a real network.
        await asyncio.sleep(2 * self.one_way_s)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        for src, dst in ((client_r, server_w), (server_r, client_w)):
            task = asyncio.ensure_future(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy ``src`` to ``dst``, each chunk delivered ``one_way_s`` after it arrived."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                    return
                dst.write(data)
                with contextlib.suppress(ConnectionError):
                    await dst.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await src.read(1 << 16)
                await queue.put((time.monotonic() + self.one_way_s, data))
                if not data:
                    break
            await sender
        except (ConnectionError, asyncio.CancelledError):
            sender.cancel()
        finally:
            with contextlib.suppress(Exception):
                dst.close()


@contextlib.contextmanager
def delayed_endpoint(endpoint: str, rtt_s: float) -> Iterator[LatencyProxy]:
    """A proxy in front of ``http://host:port`` adding ``rtt_s`` to every round trip."""
    host, _, port = endpoint.removeprefix("http://").partition(":")
    with LatencyProxy(host, int(port.rstrip("/")), rtt_s / 2) as proxy:
        yield proxy


def _serve_in_process(endpoint: str, rtt_s: float, conn: Any) -> None:
    with delayed_endpoint(endpoint, rtt_s) as proxy:
        conn.send(proxy.port)
        conn.recv()  # until told to stop


@contextlib.contextmanager
def delayed_endpoint_process(endpoint: str, rtt_s: float) -> Iterator[str]:
    """:func:`delayed_endpoint` in a process of its own; yields its endpoint. A benchmark whose reader keeps
    a core busy measures the network, not a proxy sharing its interpreter (and its lock) with the reader."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_in_process, args=(endpoint, rtt_s, child), name="latency-proxy", daemon=True)
    proc.start()
    try:
        port = parent.recv()
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(OSError):
            parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
