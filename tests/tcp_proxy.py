"""A TCP proxy for fault tests: in front of a real server, it passes bytes through, or
refuses connections, swallows them (a black hole), slows every chunk down, or resets every
open connection. Loopback only. Given an ``ssl`` server context it terminates TLS in front of
a plain server (an https endpoint for a member kmock serves over http)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl as _ssl
from typing import Literal

Mode = Literal["pass", "blackhole", "slow"]


class TcpProxy:
    def __init__(
        self, upstream_port: int, delay: float = 0.5, ssl: _ssl.SSLContext | None = None
    ) -> None:
        self.upstream_port = upstream_port
        self.ssl = ssl
        self.delay = delay
        self.mode: Mode = "pass"
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"{'http' if self.ssl is None else 'https'}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen (on the same port again after ``refuse``)."""
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, ssl=self.ssl
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def refuse(self) -> None:
        """Stop listening: new connections are refused; open ones are reset."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.reset()

    def reset(self) -> None:
        """Abort every open connection (an RST to both sides)."""
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def close(self) -> None:
        await self.refuse()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        if self.mode == "blackhole":
            with contextlib.suppress(ConnectionError):
                while await reader.read(65536):
                    pass  # swallowed: no answer ever
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._open.add(up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                if self.mode == "slow":
                    await asyncio.sleep(self.delay)  # the fault itself: a slow network
                if self.mode == "blackhole":
                    continue  # from now on, nothing gets through
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._open.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()
