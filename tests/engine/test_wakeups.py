"""Paced wake-ups (engine/wakeups.py): a set() of an event thousands wait on wakes them a few
per turn of the loop, in order, and their time-outs go the same way."""

from __future__ import annotations

import asyncio
from itertools import pairwise

from engine import wakeups
from engine.wakeups import PacedEvent, pacer_for


async def _turns_until(done: asyncio.Future[None], woken: list[int]) -> list[int]:
    """How many waiters had woken at each turn of the loop until `done`."""
    seen: list[int] = []
    while not done.done():
        seen.append(len(woken))
        await asyncio.sleep(0)  # one turn
    return seen


def test_a_set_wakes_its_waiters_a_few_per_turn_in_order() -> None:
    async def main() -> None:
        event = PacedEvent()
        woken: list[int] = []
        count = 5 * wakeups.PER_TURN + 3

        async def waiter(i: int) -> None:
            assert await event.wait() is True
            woken.append(i)

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(count)]
        await asyncio.sleep(0)
        assert event.waiting == count
        event.set()
        assert event.is_set() and event.waiting == 0
        done = asyncio.ensure_future(asyncio.gather(*tasks))
        seen = await _turns_until(done, woken)
        assert woken == list(range(count))  # in the order they came
        steps = [b - a for a, b in pairwise(seen)]
        assert max(steps) <= wakeups.PER_TURN and len([s for s in steps if s]) >= 5, steps
        assert await event.wait() is True  # set once: stays set

    asyncio.run(main())


def test_time_outs_are_paced_too_and_leavers_leave_no_trace() -> None:
    async def main() -> None:
        event = PacedEvent()
        count = 3 * wakeups.PER_TURN
        woken: list[int] = []

        async def waiter(i: int) -> None:
            assert await event.wait(0.05) is False
            woken.append(i)

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(count)]
        cancelled = asyncio.ensure_future(event.wait())
        await asyncio.sleep(0)
        assert event.waiting == count + 1
        cancelled.cancel()
        await asyncio.sleep(0)
        assert event.waiting == count  # gone at once, the others untouched
        done = asyncio.ensure_future(asyncio.gather(*tasks))
        seen = await _turns_until(done, woken)
        steps = [b - a for a, b in pairwise(seen)]
        assert sorted(woken) == list(range(count)) and max(steps) <= wakeups.PER_TURN, steps
        assert event.waiting == 0 and not event.is_set()
        # a set() after a time-out and a time-out after a set() each resolve a wait once
        late = asyncio.ensure_future(event.wait(0.01))
        await asyncio.sleep(0)
        event.set()
        assert await late is True

    asyncio.run(main())


def test_the_pacer_runs_callbacks_in_order_and_survives_one_that_fails() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[object] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
        pacer = pacer_for(loop)
        assert pacer_for(loop) is pacer
        ran: list[int] = []

        def fail() -> None:
            raise RuntimeError("boom")

        pacer.call(fail)
        for i in range(2 * wakeups.PER_TURN):
            pacer.call(lambda i=i: ran.append(i))
        while pacer.queued:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ran == list(range(2 * wakeups.PER_TURN))
        assert [str(e) for e in errors] == ["boom"]

    asyncio.run(main())
