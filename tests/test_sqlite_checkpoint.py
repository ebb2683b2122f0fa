"""WAL checkpoints run on a thread of their own, never inside a commit.

(`gateway.store.sqlite_checkpoint`.)
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from gateway.engine.models import ClaimRequest, Resolution, StoredResponse
from gateway.store import sqlite_checkpoint
from gateway.store.sqlite import SqliteStore

RECEIPT = StoredResponse(status=201, headers=(), body=b"x" * 3000)


async def _claim_and_complete(store: SqliteStore, count: int) -> None:
    for n in range(count):
        claimed = await store.claim(
            ClaimRequest(scope="s", key=f"k-{n}", fingerprint="f", route="r", method="POST",
                         path="/r", owner="o", lease_seconds=30, tombstone_seconds=600)
        )  # fmt: skip
        operation = claimed.operation
        assert operation is not None
        await store.complete(
            operation.id,
            operation.token,
            RECEIPT,
            body_retained=True,
            retention_seconds=3600,
            tombstone_seconds=7200,
            resolution=Resolution(by="upstream", at=0.0),
        )


async def test_checkpoints_keep_the_log_small_from_their_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    checkpoint = sqlite_checkpoint.WalCheckpointer._checkpoint

    def noted(self: sqlite_checkpoint.WalCheckpointer, connection: sqlite3.Connection) -> None:
        threads.append(threading.current_thread().name)
        checkpoint(self, connection)

    monkeypatch.setattr(sqlite_checkpoint.WalCheckpointer, "_checkpoint", noted)
    store = SqliteStore(path=tmp_path / "s.db")
    await store.open()
    try:
        await _claim_and_complete(store, 600)  # about 6 MB of log written
        wal = (tmp_path / "s.db-wal").stat().st_size
    finally:
        await store.close()
    assert threads, "no checkpoint ran"
    assert set(threads) == {"sqlite-checkpoint"}
    # One checkpoint's worth of pages past the threshold at most, then it wraps.
    assert wal < 3 * sqlite_checkpoint.CHECKPOINT_PAGES * 4096, wal


async def test_a_slow_checkpoint_does_not_hold_up_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint stuck on the disk (held here) leaves the writer committing: before,
    the commit that crossed 1,000 pages ran the checkpoint itself and waited for it."""
    started, release = threading.Event(), threading.Event()
    checkpoint = sqlite_checkpoint.WalCheckpointer._checkpoint

    def held(self: sqlite_checkpoint.WalCheckpointer, connection: sqlite3.Connection) -> None:
        started.set()
        release.wait(60)
        checkpoint(self, connection)

    monkeypatch.setattr(sqlite_checkpoint.WalCheckpointer, "_checkpoint", held)
    store = SqliteStore(path=tmp_path / "s.db")
    await store.open()
    try:
        await _claim_and_complete(store, 300)
        assert started.is_set(), "no checkpoint began"
        await _claim_and_complete_more(store)  # commits go on while it is held
    finally:
        release.set()
        await store.close()


async def _claim_and_complete_more(store: SqliteStore) -> None:
    for n in range(50):
        claimed = await store.claim(
            ClaimRequest(scope="s", key=f"more-{n}", fingerprint="f", route="r",
                         method="POST", path="/r", owner="o", lease_seconds=30,
                         tombstone_seconds=600)
        )  # fmt: skip
        assert claimed.operation is not None
