"""`FileJournal`: one run's journal as a JSON file, replaced atomically and fsynced.

Every write goes to a temporary file in the same directory, is fsynced,
renamed over the journal, and the directory is fsynced, so a crash at any
instant leaves either the old journal or the new one. Writers serialize on the
journal's lock, hidden files `.<journal>.lock.<n>` beside it (`_lock_file.py`:
a protocol the Node client shares, so Python and Node workers exclude each
other), and re-read the journal under it to check their lease before writing.
Hidden, so that a runs directory lists its journals and nothing else: the
lock's last generation and its marker stay after a run (the highest
generation is never removed, see `_lock_file.py`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from idempotency_gateway_client._exceptions import IncompatibleJournal
from idempotency_gateway_client._journal import (
    Worker,
    fence,
    grant,
    parse_document,
    released,
    renewed,
)
from idempotency_gateway_client._lock_file import LockFile
from idempotency_gateway_client._records import JournalDocument

__all__ = ["FileJournal"]


class FileJournal:
    """A `JournalStore` holding one run in one JSON file.

    >>> journal = FileJournal("runs/run-77.json")
    >>> async with Run(journal, client=gw, run_id="run-77", flow_version="v1", tools=TOOLS) as run:
    ...     await run.step(plan)
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout: float = 10.0) -> None:
        if lock_timeout <= 0:
            raise ValueError(f"lock_timeout must be > 0 seconds, got {lock_timeout!r}")
        self.path = Path(path)
        self.lock_path = self.path.with_name(f".{self.path.name}.lock")
        self.lock_timeout = lock_timeout
        self._lock = LockFile(self.lock_path, lock_timeout)

    def __repr__(self) -> str:
        return f"FileJournal({str(self.path)!r})"

    def read(self) -> JournalDocument | None:
        """The journal in the file, whatever run it holds; None when there is no file."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_document(raw, str(self.path))

    def load(self, run_id: str) -> JournalDocument | None:
        document = self.read()
        if document is not None and document.run_id != run_id:
            raise IncompatibleJournal(
                f"{self.path} holds run {document.run_id!r}, not {run_id!r}; "
                "use one journal file per run"
            )
        return document

    def acquire(
        self, run_id: str, flow_version: str, worker: Worker, *, duration: float
    ) -> JournalDocument:
        with self._locked():
            document = grant(
                self.read(), run_id, flow_version, worker, now=time.time(), duration=duration
            )
            self._replace(document)
            return document

    def write(self, document: JournalDocument, *, duration: float) -> JournalDocument:
        with self._locked():
            fence(self.read(), document)
            stored = renewed(document, now=time.time(), duration=duration)
            self._replace(stored)
            return stored

    def release(self, document: JournalDocument) -> None:
        with self._locked():
            fence(self.read(), document)
            self._replace(released(document))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock.held():
            yield

    def _replace(self, document: JournalDocument) -> None:
        temporary = self.path.with_name(
            f".{self.path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        )
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = document.to_json()
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
