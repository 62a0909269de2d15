"""The cleaner's I/O rate limit (log.cleaner.io.max.bytes.per.second): the throttler's accounting
on a fake clock, a throttled pass against the table view, and the setting through a real server."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.settings import Settings
from engine.config import LogConfig
from tests.engine.helpers import FakeClock, append_records, running_log
from tests.workers.test_compaction import read_all, table
from workers.compactor import compact_partition
from workers.throttler import Throttler, sleep_needed_s


class FakeTime:
    """A clock that only moves when told to: by the work (`work`) or by the throttler's sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds

    def work(self, seconds: float) -> None:
        self.now += seconds


def _throttler(rate: float, t: FakeTime, interval: float = 0.3) -> Throttler:
    return Throttler(rate, check_interval_s=interval, clock=t, sleep=t.sleep)


# -- the pure function --------------------------------------------------------------------------


def test_sleep_needed_is_the_time_the_bytes_lack() -> None:
    assert sleep_needed_s(1000, 0.25, 1000.0) == pytest.approx(0.75)  # 1 s needed, 0.25 s passed
    assert sleep_needed_s(1000, 1.0, 1000.0) == 0.0  # exactly on the rate
    assert sleep_needed_s(1000, 2.0, 1000.0) == 0.0  # slower than the rate
    assert sleep_needed_s(0, 0.0, 1000.0) == 0.0  # an empty window
    assert sleep_needed_s(10**12, 0.0, math.inf) == 0.0  # unlimited


# -- the throttler on a fake clock ----------------------------------------------------------------


def test_under_the_rate_it_never_sleeps_and_windows_close_at_the_interval() -> None:
    t = FakeTime()
    th = _throttler(1000.0, t, interval=0.5)  # 1000 B/s: 500 B per 0.5 s window
    for _ in range(9):
        t.work(0.25)
        assert th.maybe_throttle(100) == 0.0  # 400 B/s
    assert t.sleeps == [] and th.slept_s == 0.0 and th.total_bytes == 900
    # a window closed every 0.5 s (4 of them); the open one holds the last 0.25 s
    assert th.window_bytes == 100


def test_over_the_rate_it_sleeps_what_the_window_lacks_then_opens_a_new_window() -> None:
    t = FakeTime()
    th = _throttler(1000.0, t, interval=0.5)
    t.work(0.125)
    assert th.maybe_throttle(250) == 0.0  # under one window's 500 B, before 0.5 s
    t.work(0.125)
    assert th.maybe_throttle(500) == 0.5  # 750 B need 0.75 s; 0.25 s passed
    assert t.sleeps == [0.5] and t.now == 0.75
    assert th.window_bytes == 0 and th.sleeps == 1
    # the new window opened after the sleep: 0.5 s of work at 1000 B/s is exactly on the rate
    for _ in range(2):
        t.work(0.25)
        assert th.maybe_throttle(250) == 0.0
    assert t.sleeps == [0.5] and th.window_bytes == 0  # that window was checked and closed
    assert th.total_bytes == 1250 and th.slept_s == 0.5


def test_a_burst_shorter_than_the_interval_is_throttled_at_once() -> None:
    """A pass that would end before the first interval is still held to the rate."""
    t = FakeTime()
    th = _throttler(1000.0, t, interval=0.5)
    assert th.maybe_throttle(1000) == 1.0  # no time passed: 1000 B need 1 s
    assert th.maybe_throttle(499) == 0.0  # a new window, under its allowance
    assert th.maybe_throttle(1) == 0.5
    assert th.total_bytes == 1500 and th.slept_s == 1.5 and t.now == 1.5


def test_unlimited_never_reads_the_clock_nor_sleeps() -> None:
    def no_clock() -> float:
        raise AssertionError("the clock was read")

    def no_sleep(_seconds: float) -> None:
        raise AssertionError("slept")

    th = Throttler(math.inf, clock=no_clock, sleep=no_sleep)
    for _ in range(1000):
        assert th.maybe_throttle(1 << 20) == 0.0
    assert th.total_bytes == 1000 << 20 and th.slept_s == 0.0


@pytest.mark.parametrize("rate", [0, -1.0, math.nan])
def test_a_rate_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        Throttler(rate)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from([100.0, 1e3, 5e6]),
    interval=st.sampled_from([0.01, 0.3, 2.0]),
    steps=st.lists(
        st.tuples(st.integers(0, 4_000_000), st.floats(0.0, 0.5)), min_size=1, max_size=80
    ),
)
def test_the_pass_keeps_to_the_rate_and_never_sleeps_more_than_needed(
    rate: float, interval: float, steps: list[tuple[int, float]]
) -> None:
    """For any mix of reads/writes and work time: once a window is checked, the time since the
    start covers the checked bytes at the rate; and the sleeps add up to no more than all the
    bytes need at the rate (work time only ever reduces them)."""
    t = FakeTime()
    begin = t.now
    th = _throttler(rate, t, interval)
    worked = 0.0
    for n, seconds in steps:
        t.work(seconds)
        worked += seconds
        th.maybe_throttle(n)
        checked = th.total_bytes - th.window_bytes
        assert t.now - begin >= checked / rate - 1e-6
    assert th.total_bytes == sum(n for n, _ in steps)
    assert th.slept_s <= th.total_bytes / rate + 1e-6
    assert th.slept_s == pytest.approx(sum(t.sleeps))
    assert t.now - begin == pytest.approx(worked + th.slept_s)


# -- a pass with a low limit ----------------------------------------------------------------------


async def _fill(log, clock: FakeClock, rng: random.Random) -> list:
    for _ in range(80):
        items = [
            (f"k{rng.randrange(40)}".encode(), None if rng.random() < 0.05 else rng.randbytes(rng.randint(200, 2000)), clock(), ())
            for _ in range(rng.randint(1, 8))
        ]
        await append_records(log, items, compression_type=rng.choice([0, 0, 3]))
        clock.now += 1
    await log.roll()
    return read_all(log)


@pytest.mark.parametrize("run_in", ["thread", "process"])
async def test_a_throttled_pass_keeps_the_table_view(tmp_path: Path, run_in: str) -> None:
    """~0.8 MB read and written at 1 MB/s: the pass sleeps, its outcome counts every byte, and
    the result is what an unlimited pass gives."""
    config = LogConfig(cleanup_policy="compact", segment_bytes=40_000, file_delete_delay_ms=0)
    results = {}
    for limit in (math.inf, 1e6):
        clock = FakeClock()
        directory = tmp_path / f"limit-{limit}" / "t-0"
        directory.mkdir(parents=True)
        async with running_log(directory, config, clock=clock) as log:
            before = await _fill(log, clock, random.Random(11))
            result = await compact_partition(
                log, cleaner_checkpoint=None, map_budget_bytes=1 << 20, run_in=run_in, io_max_bytes_per_s=limit
            )
            after = read_all(log)
        assert result.cleaned and result.records_removed > 0
        assert table(after) == table(before)
        o = result.outcome
        assert o["io_bytes"] == o["map_bytes_read"] + o["bytes_read"] + o["bytes_written"]
        assert o["map_bytes_read"] > 0 and o["bytes_read"] > 0 and o["bytes_written"] > 0
        results[limit] = (result, [(r.offset, r.key, r.value, r.timestamp) for r in after])
    unlimited, throttled = results[math.inf][0], results[1e6][0]
    assert unlimited.throttled_seconds == 0.0
    # far more than one 300 ms window's allowance (300 kB) at 1 MB/s: the pass had to sleep
    assert throttled.outcome["io_bytes"] > 400_000 and throttled.throttled_seconds > 0
    assert throttled.throttled_seconds == throttled.outcome["throttled_seconds"]
    assert results[1e6][1] == results[math.inf][1]  # the same records, offsets and all
    assert throttled.outcome["io_bytes"] == unlimited.outcome["io_bytes"]


# -- the setting, through a real server -----------------------------------------------------------


def test_the_setting_is_checked_at_start_and_reaches_the_workers(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).worker_settings().cleaner_io_max_bytes_per_s == math.inf
    s = Settings(data_dir=tmp_path, cleaner_io_max_bytes_per_sec=5e6)
    assert s.worker_settings().cleaner_io_max_bytes_per_s == 5e6
    for bad in (0, -1, math.nan, "fast"):
        with pytest.raises(ValueError, match="cleaner_io_max_bytes_per_sec"):
            Settings(data_dir=tmp_path, cleaner_io_max_bytes_per_sec=bad)


def test_a_server_with_a_limit_throttles_its_passes(server_factory) -> None:
    server = server_factory(
        EVENTLOG_CLEANER_ENABLED="false", EVENTLOG_CLEANER_IO_MAX_BYTES_PER_SEC="1000000"
    ).start()
    rng = random.Random(5)
    model: dict[str, str] = {}
    with server.client() as c:
        r = c.post("/v1/topics", json={"name": "acct", "configs": {
            "cleanup.policy": "compact", "segment.bytes": 50_000, "file.delete.delay.ms": 0}})
        assert r.status_code == 201, r.text
        for _ in range(40):
            records = [{"key": f"k{rng.randrange(30)}", "value": rng.randbytes(600).hex()} for _ in range(10)]
            r = c.post("/v1/topics/acct/records", json={"records": records})
            assert r.status_code == 200, r.text
            for rec in records:
                model[rec["key"]] = rec["value"]
        ran = c.post("/v1/admin/compaction/run", json={"topic": "acct"})
        assert ran.status_code == 200, ran.text
        (part,) = ran.json()["partitions"]
        assert part["cleaned"] and part["records_removed"] > 0
        assert part["throttled_seconds"] > 0  # ~0.5 MB at 1 MB/s
        got: dict[str, str] = {}
        offset = 0
        while True:
            page = c.get("/v1/topics/acct/partitions/0/records", params={"offset": offset, "max_records": 1000}).json()
            for rec in page["records"]:
                got[rec["key"]] = rec["value"]
            if not page["records"]:
                break
            offset = page["next_offset"]
    assert got == model
    assert server.stop() == 0
