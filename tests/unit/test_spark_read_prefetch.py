"""connector/spark/read.py _in_order: a LedgerRun's ledgers are fetched ahead by a small pool, within a bound of
ledgers and bytes, and handed over in order; a failure surfaces at its ledger's turn; a task that stops early
leaves no fetch running."""
import threading

import pytest

from connector.spark import read
from connector.spark.read import PREFETCH_BYTES, PREFETCH_LEDGERS, _in_order
from tests.harness.poll import poll_until


class Fetches:
    """A stand-in fetch: records what ran, in what order it finished and how many ran at once; partition p yields
    [p, p]. With swapped, an even partition finishes only after the next one has (they finish out of order)."""

    def __init__(self, fail: int | None = None, swapped: int = 0):
        self.fail = fail
        self.done = [threading.Event() for _ in range(swapped)]
        self.started: list[int] = []
        self.finished: list[int] = []
        self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, partition: int):
        with self.lock:
            self.started.append(partition)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if partition % 2 == 0 and partition + 1 < len(self.done):
                assert self.done[partition + 1].wait(30), f"partition {partition + 1} was never fetched"
            if partition == self.fail:
                raise ValueError(f"ledger {partition} is gone")
            return (p for p in [partition, partition])   # lazy, as a ledger's read
        finally:
            with self.lock:
                self.running -= 1
                self.finished.append(partition)
            if partition < len(self.done):
                self.done[partition].set()


def test_a_run_comes_back_in_order_fetched_at_most_prefetch_ahead():
    fetch = Fetches(swapped=12)
    assert [list(entries) for entries in _in_order(fetch, list(range(12)), [1] * 12)] == [[p, p] for p in range(12)]
    assert sorted(fetch.started) == list(range(12))
    assert fetch.finished.index(1) < fetch.finished.index(0)   # 0 finished after 1: handed over in order all the same
    assert fetch.most <= PREFETCH_LEDGERS


def test_a_lone_partition_streams_without_a_pool(monkeypatch):
    monkeypatch.setattr(read.concurrent.futures, "ThreadPoolExecutor", None)   # any pool would fail
    fetch = Fetches()
    (entries,) = list(_in_order(fetch, [7], [-1]))
    assert not isinstance(entries, list) and list(entries) == [7, 7]   # streamed, not held


def test_a_failure_is_raised_at_its_turn_after_the_ledgers_before_it():
    got = []
    with pytest.raises(ValueError, match="ledger 5 is gone"):
        for entries in _in_order(Fetches(fail=5), list(range(10)), [1] * 10):
            got.append(list(entries)[0])
    assert got == [0, 1, 2, 3, 4]


def test_stopping_early_waits_for_running_fetches_and_starts_no_more():
    fetch = Fetches()
    fetched = _in_order(fetch, list(range(40)), [1] * 40)
    assert list(next(fetched)) == [0, 0]
    fetched.close()   # returns once the pool is shut down: queued fetches cancelled, running ones done
    assert fetch.running == 0 and len(fetch.started) <= 1 + PREFETCH_LEDGERS


def test_ledgers_are_fetched_ahead_only_within_the_byte_bound_and_a_larger_one_streams():
    fetch = Fetches()
    third = PREFETCH_BYTES // 3
    fetched = _in_order(fetch, [0, 1, 2, 3, 4, 5], [third, third, third, third, PREFETCH_BYTES + 1, 1])
    assert isinstance(next(fetched), list)
    # 0 handed over: 1, 2 and 3 are three thirds ahead; 4 would pass the bound, and 5 waits behind it
    poll_until(lambda: sorted(fetch.started) == [0, 1, 2, 3], 30, what="ledgers 1 to 3 fetched ahead")
    assert [isinstance(entries, list) for entries in fetched] == [True, True, True, False, True]   # 4 streams
    assert sorted(fetch.started) == [0, 1, 2, 3, 4, 5]


def test_a_close_from_another_thread_does_not_wait_for_running_fetches():
    release = threading.Event()
    started = threading.Event()

    def fetch(partition):
        if partition == 1:
            started.set()
            release.wait(30)
        return [partition]

    fetched = _in_order(fetch, [0, 1, 2], [1, 1, 1])
    assert next(fetched) == [0]
    assert started.wait(30)
    closer = threading.Thread(target=fetched.close)   # as the collector finalising a dropped read on its thread
    closer.start()
    closer.join(30)
    assert not closer.is_alive()   # did not wait for fetch 1, which is still running
    release.set()
