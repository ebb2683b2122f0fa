"""Checks the hostile-input tests share: the gateway stayed up and nothing happened.

"Nothing happened" has three witnesses: the counting upstream saw no new
effect, the store holds no new record (a lookup of the key is 404), and no
other host was contacted (a `ConnectionCounter` listening where a hostile
request points saw no connection).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Self

from rawhttp import RawResponse, address_of, exchange, request

from gateway.web.appkeys import STORE
from gateway.web.problems import operation_url

if TYPE_CHECKING:
    from types import TracebackType

    from harness import RunningGateway

__all__ = [
    "ConnectionCounter",
    "assert_healthy",
    "assert_no_record",
    "problem_type",
    "record_count",
]


async def assert_healthy(gateway: RunningGateway) -> None:
    """/healthz answers 200 on a fresh connection."""
    response = await exchange(address_of(gateway.url), request("GET", "/healthz"))
    assert response.status == 200, f"/healthz answered {response.status}: {response.body!r}"


async def assert_no_record(gateway: RunningGateway, key: str) -> None:
    """GET /operations/<key> is 404: the key has no operation record."""
    response = await exchange(address_of(gateway.url), request("GET", operation_url(key)))
    assert response.status == 404, f"{key!r} has a record: {response.body[:300]!r}"


async def record_count(gateway: RunningGateway) -> int:
    """How many operation records the store holds, in every state."""
    return sum((await gateway.app[STORE].count_by_state()).values())


def problem_type(response: RawResponse) -> str | None:
    """The problem type of an `application/problem+json` answer, else (or bodiless) None."""
    if response.header("content-type") != "application/problem+json" or not response.body:
        return None
    return str(json.loads(response.body)["type"]).rsplit("/", 1)[-1]


class ConnectionCounter:
    """A TCP listener on 127.0.0.1 that counts connections and closes them at once.

    Put its address wherever a hostile request points (an absolute-form
    target, a `Host` header, a `CONNECT` target, a redirect's `Location`):
    `connections == 0` afterwards proves the gateway did not go there.

    >>> async with ConnectionCounter() as elsewhere:
    ...     ...  # send f"http://{elsewhere.authority}/x" to the gateway
    ...     assert elsewhere.connections == 0
    """

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None

    @property
    def authority(self) -> str:
        """``127.0.0.1:<port>``."""
        assert self._server is not None, "ConnectionCounter is not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
