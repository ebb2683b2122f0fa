"""`GatewayClient`: calls through the gateway, lookups and resolutions, over aiohttp.

aiohttp's exceptions are translated here and nowhere else: a transport
failure becomes `GatewayConnectionError`, a gateway problem its typed
`GatewayProblem`, raised `from` the original.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Self

import aiohttp
import rfc8785
from yarl import URL

from idempotency_gateway_client._backoff import Backoff
from idempotency_gateway_client._exceptions import (
    GatewayConnectionError,
    GatewayProblem,
    UnknownKey,
)
from idempotency_gateway_client._keys import operation_path, validate_key
from idempotency_gateway_client._models import Operation, Response, StoredResponse
from idempotency_gateway_client._problems import problem_from

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["BODILESS_METHODS", "GatewayClient", "canonical_json"]

BODILESS_METHODS = frozenset({"GET", "HEAD"})
"""Methods whose requests carry no body, in both clients.

`fetch` refuses a body on them, so the TypeScript client cannot send one; a
planned call must send the same request whichever client sends it, so this
client refuses one too, before anything is sent.
"""

_NO_CONTENT_TYPE = frozenset({"Content-Type"})
"""aiohttp adds `Content-Type: application/octet-stream` to a bodiless POST, PUT or PATCH;
the gateway fingerprints the content type, and `fetch` sends none: neither may this client."""


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON (JCS): the same value gives the same bytes, in every client.

    The gateway fingerprints the body bytes, so a retry, from this process or
    from a Node worker resuming the same journal, must serialize the arguments
    exactly as the first attempt did. RFC 8785 fixes those bytes across
    languages: members sorted by UTF-16 code units, no whitespace, minimal
    string escapes, numbers as ECMAScript prints them (`1.0` is `1`). A value
    JSON cannot carry exactly to every client (an integer beyond 2^53, NaN) is a
    ValueError, raised before anything is sent.

    >>> canonical_json({"b": 1.0, "a": "é"})
    b'{"a":"\xc3\xa9","b":1}'
    """
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        raise ValueError(
            f"not sendable as canonical JSON: {exc}; send an integer beyond 2^53 as a string"
        ) from exc


def key_header(key: str) -> str:
    """The `Idempotency-Key` value that the gateway reads back as exactly `key`.

    Bare, as most clients send it, unless the bare form would read as another
    key (a leading `"`, or whitespace at either end): then a Structured Field
    string.
    """
    if not key.startswith('"') and key.strip(" \t") == key:
        return key
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


class GatewayClient:
    """An async client for agents calling tools through the idempotency gateway.

    `headers` go with every request (the scope's credential, usually
    `Authorization`). Answers with `safe_to_retry: true` (`in-progress`,
    `store-unavailable`, `route-saturated`, `lease-lost`,
    `upstream-unreachable`) are retried with the same key under `backoff`,
    honouring `Retry-After`; every other gateway problem is raised at once as
    its typed exception.

    >>> credential = {"Authorization": "Bearer t"}
    >>> async with GatewayClient("http://127.0.0.1:8080", headers=credential) as gw:
    ...     response = await gw.request(
    ...         "POST", "/tickets/v1/issues", key=derive_key("run-77", 0, "c1"), json={"title": "x"}
    ...     )
    ...     response.status, response.replayed
    (201, False)
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        backoff: Backoff | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self.headers: dict[str, str] = {"Accept-Encoding": "identity", **(headers or {})}
        self.timeout = timeout
        self.backoff = backoff or Backoff()
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> Self:
        self._ensure_session()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session this client created (a session passed in is the caller's)."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def __repr__(self) -> str:
        return f"<GatewayClient {self.base_url} backoff={self.backoff!r}>"

    async def request(
        self,
        method: str,
        path: str,
        *,
        key: str | None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        wait: float | None = None,
        backoff: Backoff | None = None,
    ) -> Response:
        """Send one request through the gateway with `key` as its `Idempotency-Key`.

        `json` is sent as canonical JSON (`canonical_json`); `content` as raw
        bytes; with neither (`json=None`, as a planned call with `json: null`)
        the request has no body and no `Content-Type` (the JSON text `null` is
        `content=b"null"`). A GET or HEAD has no body: `json` or `content` with
        one is a ValueError, raised before anything is sent, as the TypeScript
        client refuses it. `wait` asks the gateway to hold an in-flight answer
        up to that many seconds (`Prefer: wait=N`). Any answer that is not a
        gateway problem is returned, whatever its status: it is the tool's answer.
        """
        if json is not None and content is not None:
            raise ValueError("pass json or content, not both")
        method = method.upper()
        if method in BODILESS_METHODS and (json is not None or content is not None):
            raise ValueError(f"a {method} request has no body: pass no json or content")
        sent = dict(self.headers)
        sent.update(headers or {})
        if key is not None:
            if any(name.lower() == "idempotency-key" for name in headers or {}):
                raise ValueError("pass the key as key=..., not also as a header")
            sent["Idempotency-Key"] = key_header(validate_key(key))
        body = content
        if json is not None:
            body = canonical_json(json)
            sent.setdefault("Content-Type", "application/json")
        limit = self.timeout
        if wait is not None:
            if wait <= 0:
                raise ValueError(f"wait must be > 0 seconds, got {wait!r}")
            sent["Prefer"] = f"wait={wait:g}"
            limit = max(limit, wait + 10.0)
        return await self._exchange(
            method,
            path,
            body=body,
            headers=sent,
            key=key,
            limit=limit,
            backoff=backoff or self.backoff,
        )

    async def post(self, path: str, *, key: str, json: Any = None, **kwargs: Any) -> Response:
        """`request("POST", ...)`."""
        return await self.request("POST", path, key=key, json=json, **kwargs)

    async def lookup(self, key: str) -> Operation | None:
        """What the gateway knows about `key` in this scope; None when it has no record (404).

        >>> op = await gw.lookup("run-77:0:c1")
        >>> op.state if op else "never recorded"
        'completed'
        """
        try:
            response = await self._exchange(
                "GET",
                operation_path(validate_key(key)),
                body=None,
                headers=dict(self.headers),
                key=key,
                limit=self.timeout,
                backoff=self.backoff,
            )
        except UnknownKey:
            return None
        return _operation(response)

    async def resolve(
        self,
        key: str,
        outcome: Literal["applied", "not_applied"],
        *,
        response: StoredResponse | Mapping[str, Any] | None = None,
        result: Mapping[str, Any] | None = None,
        note: str | None = None,
        if_match: str | None = None,
    ) -> Operation:
        """Settle an `unknown` operation: `applied` (with the response as its receipt) or not.

        For an MCP operation the receipt is the tool `result` to replay (wire
        form: `content`, `structuredContent`, `isError`), not a `response`.
        `if_match` is the `etag` of the lookup the decision was based on; a
        changed operation is then refused (`PreconditionFailed`). `not_applied` is
        refused (`TooEarly`, the operation stays `unknown`) while the tool may still
        be applying the last send: check the tool again at its `allowed_at`.

        >>> op = await gw.lookup(key)
        >>> await gw.resolve(key, "not_applied", note="no such ticket", if_match=op.etag)
        """
        if response is not None and result is not None:
            raise ValueError("pass response (HTTP) or result (MCP), not both")
        document: dict[str, Any] = {"outcome": outcome}
        if result is not None:
            document["result"] = dict(result)
        if response is not None:
            document["response"] = (
                response.model_dump(include={"status", "headers", "body", "body_encoding"})
                if isinstance(response, StoredResponse)
                else dict(response)
            )
        if note is not None:
            document["note"] = note
        headers = {**self.headers, "Content-Type": "application/json"}
        if if_match is not None:
            headers["If-Match"] = if_match
        answer = await self._exchange(
            "POST",
            operation_path(validate_key(key)) + "/resolve",
            body=canonical_json(document),
            headers=headers,
            key=None,  # a resolution is not idempotent: a lost answer is looked up, not resent
            limit=self.timeout,
            backoff=self.backoff,
        )
        return _operation(answer)

    async def wait_settled(self, key: str, *, seconds: float) -> Operation | None:
        """Look `key` up until it is no longer `in_flight`, for at most `seconds`.

        Returns the last lookup (still `in_flight` when the time ran out).
        """
        deadline = time.monotonic() + seconds
        retry = 0
        while True:
            operation = await self.lookup(key)
            if operation is None or operation.state != "in_flight":
                return operation
            delay = min(self.backoff.delay(retry, None), deadline - time.monotonic())
            if delay <= 0:
                return operation
            await asyncio.sleep(delay)
            retry += 1

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: dict[str, str],
        key: str | None,
        limit: float,
        backoff: Backoff,
    ) -> Response:
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        url = URL(self.base_url + path, encoded=True)
        sent = 0
        waited = 0.0
        while True:
            sent += 1
            try:
                response = await self._send(method, url, body, headers, limit)
            except GatewayConnectionError as exc:
                exc.key = key
                exc.safe_to_retry = key is not None
                delay = backoff.next_delay(sent, waited, None) if key is not None else None
                if delay is None:
                    raise
            else:
                problem = problem_from(response.status, response.headers, response.body)
                if problem is None:
                    return response
                delay = _retry_delay(problem, backoff, sent, waited)
                if delay is None:
                    raise problem
            await asyncio.sleep(delay)
            waited += delay

    async def _send(
        self, method: str, url: URL, body: bytes | None, headers: dict[str, str], limit: float
    ) -> Response:
        session = self._ensure_session()
        try:
            async with session.request(
                method,
                url,
                data=body,
                headers=headers,
                skip_auto_headers=_NO_CONTENT_TYPE if body is None else None,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=limit),
            ) as answer:
                received = await answer.read()
                return Response(
                    status=answer.status,
                    headers=answer.headers,
                    body=received,
                    key=_unquote_key(answer.headers.get("Idempotency-Key")),
                    state=answer.headers.get("Idempotency-Status"),
                    replayed=answer.headers.get("Idempotent-Replayed", "").lower() == "true",
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            raise GatewayConnectionError(f"{method} {url}: {reason}") from exc


_DECIDED_AGAIN = frozenset({"too-early"})
"""Safe to repeat, but never repeated by the client: `too-early` asks the person who
resolved to check the tool again after `Retry-After` (it may apply the send meanwhile),
not to have the same verdict sent for them once the time has come."""


def _retry_delay(
    problem: GatewayProblem, backoff: Backoff, sent: int, waited: float
) -> float | None:
    if problem.safe_to_retry is not True or problem.kind in _DECIDED_AGAIN:
        return None
    return backoff.next_delay(sent, waited, problem.retry_after)


def _unquote_key(value: str | None) -> str | None:
    """The key from a response's `Idempotency-Key` (a Structured Field string when quoted)."""
    if value is None or len(value) < 2 or not (value.startswith('"') and value.endswith('"')):
        return value
    chars: list[str] = []
    escaped = False
    for char in value[1:-1]:
        if char == "\\" and not escaped:
            escaped = True
            continue
        chars.append(char)
        escaped = False
    return "".join(chars)


def _operation(response: Response) -> Operation:
    operation = Operation.model_validate_json(response.body)
    etag = response.headers.get("ETag")
    return operation.model_copy(update={"etag": etag}) if etag else operation
