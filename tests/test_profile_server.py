"""bench/profile_server.py's attribution of py-spy samples (pure functions on synthetic stacks)."""

from __future__ import annotations

from bench.profile_server import GIL, LOGGING, OTHER, categorize, summarize

LOOP = ["0x7f00 (libc.so.6)", "<module> (eventlog:6)", "Runner.run (asyncio/runners.py:118)", "uv_run (core.c:452)"]
ASGI = [*LOOP, "RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py:422)",
        "Router.__call__ (starlette/routing.py:700)"]
WORKER = ["0x7f00 (libc.so.6)", "Thread._bootstrap (threading.py:995)", "WorkerThread.run (anyio/_backends/_asyncio.py:900)"]


def test_syscalls_below_the_innermost_python_frame_win() -> None:
    flush = [*WORKER, "PartitionLog._commit_sync (engine/partition_log.py:370)", "LogSegment.flush (engine/segment.py:328)"]
    assert categorize([*flush, "fdatasync (libc.so.6)"]) == "fdatasync / fsync"
    # a libc symbol py-spy could not resolve: named by the Python frame that called it
    assert categorize([*flush, "0x7fc849aa3f16 (libc.so.6)"]) == "fdatasync / fsync"
    # the GIL wait outranks whatever the thread was about to do
    assert categorize([*flush, "take_gil (ceval_gil.h:300)", "pthread_cond_timedwait (libc.so.6)"]) == GIL


def test_idle_threads_and_the_event_loop_waiting_are_idle() -> None:
    waiting = [*WORKER, "Queue.get (queue.py:171)", "Condition.wait (threading.py:320)", "sem_wait (libc.so.6)"]
    assert categorize(waiting).startswith("idle")
    assert categorize([*LOOP, "uv__io_poll (linux.c:1546)", "epoll_pwait (libc.so.6)"]).startswith("idle")


def test_python_frames_are_attributed_by_package() -> None:
    assert categorize([*ASGI, "_parse_records (api/records.py:120)"]).startswith("eventlog api/")
    assert categorize([*ASGI, "encode_records (engine/records.py:180)"]).startswith("encode_batch")
    assert categorize([*ASGI, "parse_records (engine/produce.py:250)"]).startswith("produce service")
    assert categorize([*ASGI, "solve_dependencies (fastapi/dependencies/utils.py:705)"]).startswith("fastapi")
    assert categorize([*ASGI, "Logger.info (logging/__init__.py:1489)", "write (libc.so.6)"]) == LOGGING
    assert categorize(["0x1 (libfoo.so)"]) == OTHER


def test_summarize_splits_the_loop_thread_from_the_others() -> None:
    samples = [
        ("thread (1): MainThread", [*ASGI, "_parse_records (api/records.py:120)"], 3),
        ("thread (1): MainThread", [*LOOP, "epoll_pwait (libc.so.6)"], 1),
        ("thread (2)", [*WORKER, "LogSegment.flush (engine/segment.py:328)", "fdatasync (libc.so.6)"], 2),
        ("thread (2)", [*WORKER, "Queue.get (queue.py:171)", "sem_wait (libc.so.6)"], 6),
    ]
    out = summarize(samples)
    loop, other = out["event loop thread"], out["other threads"]
    assert loop["samples"] == 4 and loop["busy_share"] == 0.75
    assert loop["share_of_busy"] == {"eventlog api/ (JSON records parse, handlers)": 1.0}
    assert loop["inclusive_share_of_busy"]["RequestResponseCycle.run_asgi"] == 1.0
    assert other["busy_share"] == 0.25 and other["share_of_busy"] == {"fdatasync / fsync": 1.0}
