"""Answers too large to keep in the record, held on disk while the caller reads them.

Why: a receipt must never depend on how fast the caller reads. The gateway
reads every upstream answer to its end at the upstream's pace; an answer
larger than `max_stored_response` is written to a spool as it arrives and
relayed to the caller from there, at the caller's pace. The upstream
exchange (and the route slot it holds) ends with the answer's last byte,
not with the caller's.

A spool is a temporary file that is unlinked when it is created (nothing
to clean up after a crash) with mode 0600, and every chunk in it is sealed
with AES-GCM under a key of the spool's own that lives only in this
process's memory: an answer of one caller cannot be read from the disk by
anyone, including after the process died.

Bounds: one spool holds at most its `limit` (the route's `max_spool`); all
spools of a process together at most `Spooler.total` (`max_spool_total`).
A chunk that would pass either is not written: the caller of `append` then
hands the rest of the answer over directly (`hand_over`, one chunk at a
time, so the upstream is read at the caller's pace from there on).

>>> # spooler = Spooler(total=1 << 30)
>>> # spool = spooler.open(limit=64 << 20)
>>> # await spool.append(chunk); spool.end(); async for chunk in spool.chunks(): ...
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["Spool", "Spooler"]

_T = TypeVar("_T")


class Spooler:
    """Opens spools and keeps the bytes all of them hold within `total`."""

    def __init__(self, *, total: int, directory: Path | None = None, threads: bool = True) -> None:
        """`threads=False` reads and writes on the event loop (a simulation, whose world
        must not depend on when a thread is scheduled)."""
        self.total = total
        self.threads = threads
        self.used = 0
        self._directory = directory
        self.open_spools = 0
        self._ran_out = False

    @property
    def full(self) -> bool:
        """No room for another answer (an answer was refused room since bytes were last
        given back): a protected call is refused before its claim."""
        return self.used >= self.total or self._ran_out

    def open(self, limit: int) -> Spool:
        return Spool(self, limit=limit, directory=self._directory)

    def _take(self, size: int) -> bool:
        if self.used + size > self.total:
            self._ran_out = True
            return False
        self.used += size
        return True

    def _give_back(self, size: int) -> None:
        self.used -= size
        if size:
            self._ran_out = False


class Spool:
    """One answer's bytes: appended by the task reading the upstream, read once by the
    relay to the caller, concurrently. Closed by the relay (or whoever gives up on it):
    the file goes and its bytes are given back to the spooler."""

    def __init__(self, spooler: Spooler, *, limit: int, directory: Path | None) -> None:
        self._spooler = spooler
        self._limit = limit
        # Unlinked at once and mode 0600; closed by `close`, which the relay always calls.
        self._file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115
        self._fd = self._file.fileno()
        self._cipher = AESGCM(AESGCM.generate_key(bit_length=128))
        self._records: list[tuple[int, int]] = []
        self._end_offset = 0
        self.size = 0
        """Plain bytes written to the file (what this spool holds of the budget)."""
        self._direct: deque[bytes] = deque()
        self._direct_mode = False
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self._io = 0
        self._wakeup = asyncio.Event()
        self._when_ended: list[Callable[[], None]] = []
        spooler.open_spools += 1

    async def append(self, chunk: bytes) -> bool:
        """Write `chunk` to the file; False (nothing written) when it would pass the
        spool's limit or the spooler's total, or once the relay was closed."""
        if self._closed or self._direct_mode:
            return False
        if self.size + len(chunk) > self._limit or not self._spooler._take(len(chunk)):
            self._direct_mode = True
            return False
        self.size += len(chunk)
        nonce = len(self._records).to_bytes(12, "big")
        sealed = self._cipher.encrypt(nonce, chunk, None)
        offset, self._end_offset = self._end_offset, self._end_offset + len(sealed)
        await self._in_thread(os.pwrite, self._fd, sealed, offset)
        self._records.append((offset, len(sealed)))
        self._notify()
        return True

    async def hand_over(self, chunk: bytes) -> bool:
        """Pass `chunk` to the relay past the spool, once it took the one before; False
        when the relay is closed (the caller is gone: nobody needs the rest)."""
        while self._direct and not self._closed:
            await self._wait()
        if self._closed:
            return False
        self._direct.append(chunk)
        self._notify()
        return True

    def end(self, error: BaseException | None = None) -> None:
        """The upstream answer ended (whole, or with `error`, which the relay raises after
        the bytes it has)."""
        self._ended, self._error = True, error
        self._notify()
        callbacks, self._when_ended = self._when_ended, []
        for callback in callbacks:
            callback()

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def closed(self) -> bool:
        """The relay is done with the spool (the caller read it all, left, or was cut)."""
        return self._closed

    def when_ended(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the upstream answer has ended (at once if it has)."""
        if self._ended:
            callback()
        else:
            self._when_ended.append(callback)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's bytes in order, as they arrive; raises the upstream's error, if
        it broke off, after the bytes that came before it."""
        index = 0
        while True:
            if index < len(self._records):
                offset, length = self._records[index]
                sealed = await self._in_thread(os.pread, self._fd, length, offset)
                yield self._cipher.decrypt(index.to_bytes(12, "big"), sealed, None)
                index += 1
            elif self._direct:
                chunk = self._direct.popleft()
                self._notify()
                yield chunk
            elif self._ended:
                if self._error is not None:
                    raise self._error
                return
            elif self._closed:
                return
            else:
                await self._wait()

    def close(self) -> None:
        """The relay is done (or abandoned): give the bytes back; the file goes once no
        read or write of it is under way."""
        if self._closed:
            return
        self._closed = True
        self._spooler._give_back(self.size)
        self._spooler.open_spools -= 1
        self._notify()
        if self._io == 0:
            self._file.close()

    async def _in_thread(self, function: Callable[..., _T], *args: object) -> _T:
        # Disk writes may block: off the event loop. The file is closed only once no
        # read or write is in a thread (`close`), so a descriptor is never reused under one.
        if self._closed and self._io == 0 and self._file.closed:
            raise ConnectionResetError("the spool was closed")
        if not self._spooler.threads:
            return function(*args)
        self._io += 1
        try:
            return await asyncio.to_thread(function, *args)
        finally:
            self._io -= 1
            if self._closed and self._io == 0:
                self._file.close()

    async def _wait(self) -> None:
        await self._wakeup.wait()

    def _notify(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()
