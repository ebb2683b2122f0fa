"""`StatementBatcher`: PostgreSQL's group commit, checked on its own and on a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg
import pytest
from pg import claim_request, drop_schema, fresh_schema, require_postgres, url_for

from gateway.engine.errors import StoreUnavailable
from gateway.engine.models import NewAttempt
from gateway.store.postgres_batch import StatementBatcher


class Recorder:
    """A statement stand-in: doubles each input, remembers every batch it was given."""

    def __init__(self, *, fail_on: int | None = None, error: Exception | None = None) -> None:
        self.batches: list[list[int]] = []
        self.fail_on = fail_on
        self.error = error
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, inputs: Sequence[int]) -> list[int]:
        self.batches.append(list(inputs))
        await self.release.wait()
        await asyncio.sleep(0)
        if self.error is not None and (self.fail_on is None or self.fail_on in inputs):
            raise self.error
        return [2 * item for item in inputs]


async def test_a_lone_call_runs_at_once_and_alone() -> None:
    run = Recorder()
    batcher = StatementBatcher(run)
    assert await batcher.submit(21) == 42
    assert run.batches == [[21]]


async def test_calls_arriving_meanwhile_share_the_next_batch_in_order() -> None:
    """While the first batch is out, 50 more calls queue and go as one, each getting its own
    output."""
    run = Recorder()
    run.release.clear()
    batcher = StatementBatcher(run, max_in_flight=1)
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(batcher.submit(n)) for n in range(1, 51)]
    await asyncio.sleep(0)
    run.release.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [2 * n for n in range(1, 51)]
    assert run.batches == [[0], list(range(1, 51))]


async def test_batches_are_bounded() -> None:
    run = Recorder()
    run.release.clear()
    batcher = StatementBatcher(run, max_batch=8, max_in_flight=1)
    calls = [asyncio.ensure_future(batcher.submit(n)) for n in range(20)]
    await asyncio.sleep(0)
    run.release.set()
    assert await asyncio.gather(*calls) == [2 * n for n in range(20)]
    assert [len(batch) for batch in run.batches] == [1, 8, 8, 3]


async def test_a_connection_failure_fails_every_call_of_its_batch() -> None:
    run = Recorder(error=ConnectionResetError("gone"))
    batcher = StatementBatcher(run)
    results = await asyncio.gather(*(batcher.submit(n) for n in range(5)), return_exceptions=True)
    assert all(isinstance(result, ConnectionResetError) for result in results)
    run.error = None
    assert await batcher.submit(7) == 14  # the batcher is not stuck afterwards


async def test_a_data_error_fails_only_its_own_call() -> None:
    """The batch is run again call by call: the culprit fails, its neighbours succeed."""
    run = Recorder(fail_on=3, error=asyncpg.DataError("bad input"))
    run.release.clear()
    batcher = StatementBatcher(run, max_in_flight=1)
    calls = [asyncio.ensure_future(batcher.submit(n)) for n in range(6)]
    await asyncio.sleep(0)
    run.release.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[3], asyncpg.DataError)
    assert [results[n] for n in (0, 1, 2, 4, 5)] == [0, 2, 4, 8, 10]


async def test_a_cancelled_caller_does_not_disturb_its_batch() -> None:
    run = Recorder()
    run.release.clear()
    batcher = StatementBatcher(run, max_in_flight=1)
    first = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(batcher.submit(2))
    kept = asyncio.ensure_future(batcher.submit(3))
    await asyncio.sleep(0)
    gone.cancel()
    run.release.set()
    assert await first == 2
    assert await kept == 6
    await batcher.drain()
    assert gone.cancelled()


@pytest.mark.postgres
async def test_a_claim_the_server_refuses_fails_alone_in_its_batch() -> None:
    """A NUL byte is not valid PostgreSQL text: that claim is refused, the other claims
    sent in the same batch are granted."""
    postgres_store = require_postgres()
    schema = await fresh_schema()
    store = postgres_store(url_for(schema), pool_size=4)
    try:
        await store.open()
        requests = [claim_request(f"k{n}") for n in range(20)]
        requests[7] = claim_request("k7", path="/bad\x00path")
        results = await asyncio.gather(
            *(store.claim(item) for item in requests), return_exceptions=True
        )
        assert isinstance(results[7], StoreUnavailable)
        granted = [result for n, result in enumerate(results) if n != 7]
        assert all(isinstance(result, NewAttempt) for result in granted), granted
        assert await store.get("s", "k7") is None
    finally:
        await store.close()
        await drop_schema(schema)
