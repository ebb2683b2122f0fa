"""A helper process for CPU-bound work on large request bodies, shared by the front ends.

Canonical JSON is pure Python and costs about half a second per MiB; on the
event loop that half second is every other caller's latency, and a thread
would still share the interpreter lock with the loop. So work on a body of
`LARGE_BODY` bytes or more (an MCP message read and fingerprinted, an HTTP
JSON body fingerprinted) runs in a helper process, started at the first such
body; smaller ones run in place, by the same function.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["HELPER_NICENESS", "LARGE_BODY", "Offloader"]

LARGE_BODY = 8 * 1024
"""Bytes from which a body's work runs in the helper process (in place, ~5 ms of loop time)."""

HELPER_NICENESS = 10
"""How much lower the helpers' CPU priority is than the gateway's."""

T = TypeVar("T")


class Offloader:
    """Runs a picklable function in place for small bodies, in the helper for large ones.

    >>> # fingerprint = await offloader.run(len(body), fingerprints_of, *parts)
    """

    def __init__(self, *, large: int = LARGE_BODY, workers: int | None = None) -> None:
        self.large = large
        self._workers = workers or 1
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, size: int, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)`, off the event loop when `size` (the body's) is large."""
        if size < self.large:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self._helper(), function, *args)

    def _helper(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_prepare_helper,
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _prepare_helper() -> None:
    """A helper yields the CPU to the gateway (whose event loop serves every other
    caller: bulk reading can wait a little, latency cannot) and outlives no gateway,
    even one killed with SIGKILL (Linux: the kernel sends it SIGKILL when its parent
    dies); elsewhere it ends when its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway's Ctrl-C is the gateway's
    with contextlib.suppress(OSError):
        os.nice(HELPER_NICENESS)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
