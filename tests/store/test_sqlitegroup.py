"""SQLite's group writer: the writes waiting when its thread frees up go in one transaction,
each in a savepoint of its own (a write alone in its group: the transaction itself), each
caller with its own outcome, and a caller that has its answer knows its write is committed
(or not written at all)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.sqlitegroup import GroupWriter


class Refused(Exception):
    pass


def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 50")
    conn.execute("CREATE TABLE IF NOT EXISTS parent (k TEXT PRIMARY KEY)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS child (k TEXT PRIMARY KEY, "
        "parent TEXT REFERENCES parent (k) DEFERRABLE INITIALLY DEFERRED)"
    )
    return conn


@contextlib.asynccontextmanager
async def writer_on(path: Path) -> AsyncIterator[GroupWriter]:
    executor = ThreadPoolExecutor(1)
    conn = await asyncio.get_running_loop().run_in_executor(executor, _open, path)
    writer = GroupWriter(executor, conn)
    try:
        yield writer
    finally:
        await writer.drain()
        await writer.call(lambda c: c.close())
        executor.shutdown(wait=True)


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[GroupWriter]:
    async with writer_on(tmp_path / "db") as opened:
        yield opened


def insert(key: str, *, fail: bool = False) -> Callable[[sqlite3.Connection], str]:
    """A write of two statements that raises after both when ``fail``."""

    def work(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO parent VALUES (?)", (key,))
        conn.execute("INSERT INTO child VALUES (?, ?)", (f"{key}-child", key))
        if fail:
            raise Refused(key)
        return key

    return work


def stored(path: Path) -> set[str]:
    """What another connection sees: committed rows only."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {k for (k,) in conn.execute("SELECT k FROM parent")}


async def test_concurrent_writes_share_groups_and_each_gets_its_result(
    writer: GroupWriter, tmp_path: Path
) -> None:
    keys = [f"k{i}" for i in range(200)]
    results = await asyncio.gather(*(writer.write(insert(k)) for k in keys))
    assert results == keys
    assert stored(tmp_path / "db") == set(keys)  # committed when the callers got answers
    assert 1 <= writer.groups < 20


async def test_a_failing_write_undoes_only_itself(writer: GroupWriter, tmp_path: Path) -> None:
    outcomes = await asyncio.gather(
        writer.write(insert("a")),
        writer.write(insert("b", fail=True)),
        writer.write(insert("c")),
        return_exceptions=True,
    )
    assert outcomes[0] == "a" and outcomes[2] == "c"
    assert isinstance(outcomes[1], Refused)
    assert stored(tmp_path / "db") == {"a", "c"}  # b's first statement was undone too
    assert writer.groups == 1  # in one group with the others


async def test_a_failing_write_alone_in_its_group_is_undone_whole(
    writer: GroupWriter, tmp_path: Path
) -> None:
    # A group of one runs without a savepoint: the transaction is undone instead.
    with pytest.raises(Refused):
        await writer.write(insert("alone", fail=True))
    assert writer.groups == 1
    assert stored(tmp_path / "db") == set()  # both of its statements undone
    assert await writer.write(insert("next")) == "next"  # no transaction left open
    assert stored(tmp_path / "db") == {"next"}


async def test_a_failing_commit_fails_the_whole_group(writer: GroupWriter, tmp_path: Path) -> None:
    def orphan(conn: sqlite3.Connection) -> str:
        # A deferred foreign key: the statement passes, COMMIT fails.
        conn.execute("INSERT INTO child VALUES ('orphan', 'nobody')")
        return "orphan"

    outcomes = await asyncio.gather(
        writer.write(insert("a")), writer.write(orphan), return_exceptions=True
    )
    assert all(isinstance(o, sqlite3.IntegrityError) for o in outcomes), outcomes
    assert writer.groups == 1
    assert stored(tmp_path / "db") == set()
    assert await writer.write(insert("after")) == "after"  # rolled back: usable again
    assert stored(tmp_path / "db") == {"after"}


async def test_a_locked_database_fails_the_group_then_recovers(
    writer: GroupWriter, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await writer.write(insert("a"))
        other.execute("ROLLBACK")
        assert await writer.write(insert("b")) == "b"
    finally:
        other.close()
    assert stored(tmp_path / "db") == {"b"}


async def test_a_cancelled_caller_is_dropped_or_settled(
    writer: GroupWriter, tmp_path: Path
) -> None:
    started, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    def blocking(conn: sqlite3.Connection) -> str:
        loop.call_soon_threadsafe(started.set)
        release.wait(10)
        conn.execute("INSERT INTO parent VALUES ('first')")
        return "first"

    first = asyncio.create_task(writer.write(blocking))
    await started.wait()  # the first group is on the thread, holding it
    waiting = asyncio.create_task(writer.write(insert("dropped")))
    await asyncio.sleep(0)  # handed in, not taken: the thread is busy
    waiting.cancel()
    first.cancel()  # taken: its caller waits for the group's outcome
    await asyncio.sleep(0)
    assert not first.done()
    release.set()
    for task in (first, waiting):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert stored(tmp_path / "db") == {"first"}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 4))
async def test_each_write_has_its_own_outcome(fails: list[bool], waves: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        await _each_write_has_its_own_outcome(Path(directory) / "db", fails, waves)


async def _each_write_has_its_own_outcome(path: Path, fails: list[bool], waves: int) -> None:
    async with writer_on(path) as writer:
        keys = [f"k{i}" for i in range(len(fails))]
        outcomes: list[object] = []
        size = -(-len(keys) // waves)
        for start in range(0, len(keys), size):
            outcomes += await asyncio.gather(
                *(writer.write(insert(k, fail=f)) for k, f in zip(
                    keys[start:start + size], fails[start:start + size], strict=True
                )),
                return_exceptions=True,
            )  # fmt: skip
        for key, fail, outcome in zip(keys, fails, outcomes, strict=True):
            assert isinstance(outcome, Refused) if fail else outcome == key
        assert stored(path) == {k for k, f in zip(keys, fails, strict=True) if not f}
        assert writer.groups <= len(keys)


async def test_the_slowest_group_is_taken_once(writer: GroupWriter) -> None:
    assert writer.take_slowest() == 0.0  # nothing ran yet
    spent: list[float] = []

    def timed(conn: sqlite3.Connection) -> str:
        began = time.perf_counter()
        result = insert("timed")(conn)
        spent.append(time.perf_counter() - began)
        return result

    await writer.write(timed)
    await writer.write(insert("quick"))
    slowest = writer.take_slowest()
    assert slowest >= spent[0] > 0  # a group's hop holds its writes' own time
    assert writer.take_slowest() == 0.0  # taken: the next window starts afresh
