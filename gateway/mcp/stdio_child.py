"""One MCP server on stdio, started as a child process, with the gateway as its only client.

Most MCP servers speak stdio only: a host starts them and writes JSON-RPC, one
message a line, to their stdin. The gateway does the same here, once per child:
one `initialize`, then every call its callers make, each under an id of the
child's own numbering (callers' ids collide: two agents both send id 1), mapped
back on the answer. The child's requests to its client (sampling, elicitation,
roots) are refused: no caller stands behind them. A child that exits fails every
call in flight with `ChildGone`; the caller's answer is then lost, which is what
makes the call `unknown` upstream of here.

The child gets only the route's `env` (plus `PATH` and `HOME`), and no file
descriptor beyond its three pipes (`close_fds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import pwd
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gateway import __version__

__all__ = ["CHILD_PROTOCOL_VERSION", "ChildGone", "StdioChild"]

log = logging.getLogger("gateway.mcp.stdio")

CHILD_PROTOCOL_VERSION: Final = "2025-11-25"
"""The version the gateway asks its stdio children for (they answer the one they speak)."""

MAX_LINE: Final = 64 << 20
"""The longest message a child may write (a line); a longer one ends the child."""

_STDERR_LINE: Final = 2000
"""Characters of a child's stderr line kept in the gateway's log."""

_NOT_A_CLIENT: Final = (
    "the idempotency gateway is this server's only client and answers no server requests "
    "(sampling, elicitation, roots): no caller stands behind them"
)


class ChildGone(Exception):
    """The child exited (or could not start) before answering."""


class StdioChild:
    """A started, initialized stdio MCP server; `call` sends it one request."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        label: str,
        run_as: str | None = None,
    ) -> None:
        self._command = tuple(command)
        self._env = dict(env)
        self._label = label
        self._run_as = run_as
        self._process: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._write_lock = asyncio.Lock()
        self.initialize_result: dict[str, Any] = {}
        self.exited = asyncio.Event()
        self._stopping = False
        self._last_heard = 0.0
        """When the child last wrote a line (the loop's clock): what `silence` counts from."""

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        """Start the process and run the `initialize` handshake; `ChildGone` if it fails."""
        try:
            self._process = await asyncio.create_subprocess_exec(
                *as_user(self._command, self._run_as),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                limit=MAX_LINE,
                close_fds=True,
            )
        except (OSError, ValueError, KeyError) as exc:
            self.exited.set()
            raise ChildGone(
                f"the stdio server {self._command[0]!r} could not start: {exc}"
            ) from exc
        self._last_heard = asyncio.get_running_loop().time()
        self._tasks = [
            asyncio.create_task(self._read_stdout(), name=f"stdio-out:{self._label}"),
            asyncio.create_task(self._read_stderr(), name=f"stdio-err:{self._label}"),
        ]
        answer = await self.call(
            {
                "method": "initialize",
                "params": {
                    "protocolVersion": CHILD_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "idempotency-gateway", "version": __version__},
                },
            }
        )
        result = answer.get("result")
        if not isinstance(result, dict):
            await self.stop()
            raise ChildGone(f"the stdio server refused initialize: {answer.get('error')!r}")
        self.initialize_result = result
        await self.notify({"method": "notifications/initialized"})
        log.info(
            "stdio server started",
            extra={"event": "stdio-started", "route": self._label, "pid": self.pid,
                   "protocol_version": result.get("protocolVersion")},
        )  # fmt: skip

    async def call(
        self, message: Mapping[str, Any], *, silence: float | None = None
    ) -> dict[str, Any]:
        """Send a request (its `id` replaced by the child's own) and await the answer,
        given back without an `id` (the caller puts its own). `ChildGone` when the child
        exits first; `TimeoutError` once the child has said nothing at all (no answer, no
        notification) for `silence` seconds. A wait given up on, by a timeout or a
        cancellation, sends the child `notifications/cancelled` for the request."""
        child_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[child_id] = future
        given_up = True
        try:
            await self._write({**message, "jsonrpc": "2.0", "id": child_id})
            answer = await self._answer(future, silence)
            given_up = False
            return answer
        finally:
            self._pending.pop(child_id, None)
            if given_up and not self.exited.is_set():
                with contextlib.suppress(ChildGone):
                    await asyncio.shield(self._cancelled(child_id))

    async def _answer(
        self, future: asyncio.Future[dict[str, Any]], silence: float | None
    ) -> dict[str, Any]:
        if silence is None:
            return await future
        loop = asyncio.get_running_loop()
        asked = loop.time()
        while True:
            left = max(asked, self._last_heard) + silence - loop.time()
            if left <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait({future}, timeout=left)
            if done:
                return future.result()

    async def notify(self, message: Mapping[str, Any]) -> None:
        await self._write({**message, "jsonrpc": "2.0"})

    async def stop(self, grace: float = 2.0) -> None:
        """Close stdin (a stdio server's signal to end), then SIGTERM, then SIGKILL."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), grace)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._gone("stopped by the gateway")

    # -- the pipes ---------------------------------------------------------------------

    async def _cancelled(self, child_id: int) -> None:
        await self.notify(
            {"method": "notifications/cancelled", "params": {"requestId": child_id,
             "reason": "the caller closed its request"}}
        )  # fmt: skip

    async def _write(self, message: Mapping[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or self.exited.is_set():
            raise ChildGone("the stdio server is not running")
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        async with self._write_lock:
            try:
                process.stdin.write(line)
                await process.stdin.drain()
            except (ConnectionError, RuntimeError) as exc:
                raise ChildGone(f"the stdio server's stdin is closed: {exc}") from exc

    async def _read_stdout(self) -> None:
        assert self._process is not None
        stdout = self._process.stdout
        assert stdout is not None
        reason = "exited"
        try:
            while line := await stdout.readline():
                self._last_heard = asyncio.get_running_loop().time()
                self._dispatch(line)
        except (ValueError, asyncio.LimitOverrunError):
            reason = f"wrote a message longer than {MAX_LINE} bytes"
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        code = await self._process.wait()
        self._gone(f"{reason} (exit status {code})")

    async def _read_stderr(self) -> None:
        assert self._process is not None
        stderr = self._process.stderr
        assert stderr is not None
        while line := await stderr.readline():
            text = line.decode("utf-8", "replace").rstrip()[:_STDERR_LINE]
            log.info(
                "stdio server: %s", text,
                extra={"event": "stdio-stderr", "route": self._label, "pid": self.pid},
            )  # fmt: skip

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            log.warning(
                "stdio server wrote a line that is not JSON",
                extra={"event": "stdio-not-json", "route": self._label, "size": len(line)},
            )
            return
        if not isinstance(message, dict):
            return
        if "method" in message:
            if "id" in message:  # a server request: refused, nobody is there to answer it
                refusal = {"id": message["id"], "error": {"code": -32601, "message": _NOT_A_CLIENT}}
                task = asyncio.create_task(self._refuse(refusal))
                self._tasks.append(task)
            return  # a notification (progress, logging, list changes): not relayed
        future = self._pending.get(message.get("id"))  # type: ignore[arg-type]
        if future is not None and not future.done():
            message.pop("id", None)
            message.pop("jsonrpc", None)
            future.set_result(message)

    async def _refuse(self, refusal: dict[str, Any]) -> None:
        with contextlib.suppress(ChildGone):
            await self.notify(refusal)

    def _gone(self, reason: str) -> None:
        if not self.exited.is_set():
            log.log(
                logging.INFO if self._stopping else logging.WARNING,
                "stdio server %s", reason,
                extra={"event": "stdio-exited", "route": self._label, "pid": self.pid,
                       "in_flight": len(self._pending)},
            )  # fmt: skip
        self.exited.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChildGone(f"the stdio server {reason}"))


def child_environment(
    env: Mapping[str, str], parent: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The route's `env` table plus `PATH` and `HOME` from the gateway's own: nothing else
    of the gateway's environment (its store URL, its keys) reaches the child."""
    inherited = {name: parent[name] for name in ("PATH", "HOME") if name in parent}
    return {**inherited, **env}


def as_user(command: Sequence[str], user: str | None) -> tuple[str, ...]:
    """`command`, run as `user` through util-linux's `setpriv` (its uid, group and
    supplementary groups) when one is named: every event loop can start that, and no
    Python code runs between fork and exec in a process with threads."""
    if user is None:
        return tuple(command)
    entry = pwd.getpwnam(user)
    return (
        "setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--",
        *command,
    )  # fmt: skip
