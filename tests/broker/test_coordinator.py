"""The classic group coordinator (broker/coordinator.py) against Kafka's rules: joins, generations
and leaders, sessions, leaves, static members, the errors of SyncGroup and Heartbeat, the
rebalance and sync timeouts, the admin calls, offset-commit validation, and a hypothesis state
machine over all of it. Time is a fake clock advanced by hand, with `expire()` as the timer's
tick, so nothing here sleeps (but the one test of the real loop)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine, Sequence

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from broker.coordinator import (
    GroupCoordinator,
    GroupState,
    JoinResult,
    SyncResult,
    _Group,
)

GROUP = "g"
SESSION_MS = 10_000
REBALANCE_MS = 5_000
DELAY_MS = 100
RANGE = (("range", b"range-meta"),)


class Clock:
    """A monotonic clock in milliseconds that moves only when told (whole ms: exact deadlines)."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coord(clock: Clock) -> GroupCoordinator:
    return GroupCoordinator(
        clock=clock, initial_rebalance_delay_ms=DELAY_MS, min_session_timeout_ms=1
    )


async def settle() -> None:
    """Let every task that can run, run (a parked JoinGroup parks in its first step)."""
    for _ in range(5):
        await asyncio.sleep(0)


def join(
    coord: GroupCoordinator,
    member_id: str = "",
    *,
    client: str = "client",
    version: int = 5,
    session_ms: int = SESSION_MS,
    rebalance_ms: int = REBALANCE_MS,
    protocols: Sequence[tuple[str, bytes]] = RANGE,
    instance: str | None = None,
    protocol_type: str = "consumer",
    group: str = GROUP,
) -> asyncio.Task[JoinResult]:
    return asyncio.create_task(
        coord.join_group(
            group,
            member_id,
            version=version,
            client_id=client,
            client_host=f"/host-{client}",
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocol_type=protocol_type,
            protocols=protocols,
            group_instance_id=instance,
        )
    )


def sync(
    coord: GroupCoordinator,
    generation: int,
    member_id: str,
    assignments: Sequence[tuple[str, bytes]] = (),
    *,
    instance: str | None = None,
    protocol_name: str | None = None,
) -> asyncio.Task[SyncResult]:
    return asyncio.create_task(
        coord.sync_group(
            GROUP,
            generation,
            member_id,
            group_instance_id=instance,
            protocol_type="consumer",
            protocol_name=protocol_name,
            assignments=assignments,
        )
    )


async def run_until_done(
    coord: GroupCoordinator,
    clock: Clock,
    tasks: Sequence[asyncio.Task],
    step_ms: int = DELAY_MS,
    limit: int = 200,
) -> list:
    """Advance the clock a step at a time, running the timer, until every task is answered."""
    await settle()
    for _ in range(limit):
        if all(t.done() for t in tasks):
            return [t.result() for t in tasks]
        clock.advance(step_ms)
        coord.expire()
        await settle()
    raise AssertionError("the tasks were never answered")


async def member_ids(
    coord: GroupCoordinator, clients: Sequence[str], version: int = 5
) -> list[str]:
    """First joins at v4+: each gets MEMBER_ID_REQUIRED and the id to join with."""
    results = await asyncio.gather(*(join(coord, client=c, version=version) for c in clients))
    assert all(r.error == ErrorCode.member_id_required for r in results), results
    for client, r in zip(clients, results, strict=True):
        assert r.member_id.startswith(f"{client}-") and r.generation_id == -1
    return [r.member_id for r in results]


async def form_group(coord: GroupCoordinator, clock: Clock, n: int) -> list[JoinResult]:
    """n dynamic members through MEMBER_ID_REQUIRED and the initial rebalance delay."""
    ids = await member_ids(coord, [f"c{i}" for i in range(n)])
    tasks = []
    for i, member_id in enumerate(ids):
        tasks.append(join(coord, member_id, client=f"c{i}"))
        await settle()  # in this order: the first is the leader
    return await run_until_done(coord, clock, tasks)


def assignments_for(results: Sequence[JoinResult]) -> list[tuple[str, bytes]]:
    return [(r.member_id, f"a-{r.member_id}".encode()) for r in results]


async def stable_group(coord: GroupCoordinator, clock: Clock, n: int) -> list[JoinResult]:
    results = await form_group(coord, clock, n)
    leader = results[0]
    tasks = [sync(coord, r.generation_id, r.member_id) for r in results[1:]]
    tasks.insert(0, sync(coord, leader.generation_id, leader.member_id, assignments_for(results)))
    synced = await asyncio.gather(*tasks)
    assert [s.error for s in synced] == [ErrorCode.none] * n
    assert await state(coord) == "Stable"
    return results


async def state(coord: GroupCoordinator, group: str = GROUP) -> str:
    (description,) = await coord.describe_groups([group])
    return description.state


def internal(coord: GroupCoordinator, group: str = GROUP) -> _Group:
    return coord._groups[group]


# -- joins, generations, leaders -------------------------------------------------------------


async def test_three_members_get_one_generation_with_one_leader(
    coord: GroupCoordinator, clock: Clock
) -> None:
    results = await form_group(coord, clock, 3)
    assert [r.error for r in results] == [ErrorCode.none] * 3
    assert {r.generation_id for r in results} == {1}
    assert {r.leader for r in results} == {results[0].member_id}
    assert all(r.protocol_name == "range" and r.protocol_type == "consumer" for r in results)
    leader, *followers = results
    assert [(m.member_id, m.metadata) for m in leader.members] == [
        (r.member_id, b"range-meta") for r in results
    ]
    assert all(f.members == () for f in followers)
    assert await state(coord) == "CompletingRebalance"

    # followers wait in SyncGroup until the leader's assignment comes
    waiting = [sync(coord, 1, f.member_id, protocol_name="range") for f in followers]
    await settle()
    assert not any(t.done() for t in waiting)
    assert await coord.heartbeat(GROUP, 1, followers[0].member_id) == ErrorCode.none
    led = await sync(coord, 1, leader.member_id, assignments_for(results)[:2])  # the third left out
    assert (led.error, led.assignment, led.protocol_name) == (
        ErrorCode.none,
        f"a-{leader.member_id}".encode(),
        "range",
    )
    got = [t.result() for t in waiting]
    assert got[0].assignment == f"a-{followers[0].member_id}".encode()
    assert (got[1].error, got[1].assignment) == (ErrorCode.none, b"")  # left out: an empty one
    assert await state(coord) == "Stable"
    # a SyncGroup again while Stable answers the stored assignment
    again = await sync(coord, 1, followers[0].member_id)
    assert again.assignment == got[0].assignment


async def test_first_rebalance_waits_the_initial_delay_and_longer_while_members_come(
    coord: GroupCoordinator, clock: Clock
) -> None:
    (a, b) = await member_ids(coord, ["a", "b"])
    first = join(coord, a, client="a")
    await settle()
    clock.advance(50)
    second = join(coord, b, client="b")
    await settle()
    clock.advance(50)
    coord.expire()  # the delay is over, but a member came meanwhile: wait another delay
    await settle()
    assert not first.done() and not second.done()
    clock.advance(DELAY_MS)
    coord.expire()
    await settle()
    assert first.result().generation_id == second.result().generation_id == 1


async def test_a_late_joiner_rebalances_everyone_into_the_next_generation(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    (c_id,) = await member_ids(coord, ["c"])
    assert await state(coord) == "Stable"  # a member id given out is no member yet
    c = join(coord, c_id, client="c")
    await settle()
    assert await state(coord) == "PreparingRebalance" and not c.done()
    for r in (a, b):
        assert await coord.heartbeat(GROUP, 1, r.member_id) == ErrorCode.rebalance_in_progress
    # a SyncGroup of the old generation is told to rejoin
    assert (await sync(coord, 1, b.member_id)).error == ErrorCode.rebalance_in_progress
    rejoined = [join(coord, a.member_id, client="c0"), join(coord, b.member_id, client="c1")]
    results = await asyncio.gather(c, *rejoined)  # all rejoined: no timer needed
    assert {r.generation_id for r in results} == {2}
    assert {r.leader for r in results} == {a.member_id}  # the leader is kept
    assert {m.member_id for m in results[1].members} == {a.member_id, b.member_id, c_id}
    assert results[0].members == () and results[2].members == ()


async def test_a_follower_rejoining_unchanged_while_stable_gets_the_current_generation(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    again = await join(coord, b.member_id, client="c1")
    assert (again.error, again.generation_id, again.leader) == (ErrorCode.none, 1, a.member_id)
    assert await state(coord) == "Stable"
    # new metadata, though, rebalances
    changed = join(coord, b.member_id, client="c1", protocols=(("range", b"other"),))
    await settle()
    assert await state(coord) == "PreparingRebalance" and not changed.done()


async def test_the_protocol_is_one_every_member_supports_chosen_by_votes(
    coord: GroupCoordinator, clock: Clock
) -> None:
    both = (("range", b"r"), ("roundrobin", b"rr"))
    tasks = [
        join(coord, client="a", version=3, protocols=both),
        join(coord, client="b", version=3, protocols=(("roundrobin", b"rr"), ("range", b"r"))),
        join(coord, client="c", version=3, protocols=(("roundrobin", b"rr2"),)),
    ]
    results = await run_until_done(coord, clock, tasks)
    assert {r.protocol_name for r in results} == {"roundrobin"}  # the only one c supports
    assert {m.metadata for m in results[0].members} == {b"rr", b"rr2"}

    # a member supporting none of the group's protocols, or another type, is refused
    late = await join(coord, client="d", version=3, protocols=(("sticky", b"s"),))
    assert late.error == ErrorCode.inconsistent_group_protocol and late.member_id == ""
    other = await join(coord, client="d", version=3, protocol_type="connect", protocols=both)
    assert other.error == ErrorCode.inconsistent_group_protocol

    votes = GroupCoordinator(
        clock=clock, initial_rebalance_delay_ms=DELAY_MS, min_session_timeout_ms=1
    )
    tasks = [
        join(votes, client="a", version=3, protocols=both),
        join(votes, client="b", version=3, protocols=both),
        join(votes, client="c", version=3, protocols=(("roundrobin", b"rr"), ("range", b"r"))),
    ]
    assert {r.protocol_name for r in await run_until_done(votes, clock, tasks)} == {
        "range"
    }  # 2 to 1


async def test_member_id_required_from_v4_and_the_pending_id_expires(
    coord: GroupCoordinator, clock: Clock
) -> None:
    (pending,) = await member_ids(coord, ["app"], version=4)
    assert pending in internal(coord).pending_join
    # not a member yet: it cannot heartbeat or sync
    assert await coord.heartbeat(GROUP, 0, pending) == ErrorCode.unknown_member_id
    assert (await sync(coord, 0, pending)).error == ErrorCode.unknown_member_id
    joined = await run_until_done(coord, clock, [join(coord, pending, client="app", version=4)])
    assert (joined[0].error, joined[0].member_id, joined[0].generation_id) == (
        ErrorCode.none,
        pending,
        1,
    )
    assert not internal(coord).pending_join

    # below v4 a first join is a member at once, with an id made the same way
    (old,) = await run_until_done(
        coord, clock, [join(coord, client="legacy", version=3, group="h")]
    )
    assert (
        old.error == ErrorCode.none
        and old.member_id.startswith("legacy-")
        and old.generation_id == 1
    )

    # an id given out and never used is dropped after the session timeout
    (stale,) = await member_ids(coord, ["gone"], version=4)
    clock.advance(SESSION_MS)
    coord.expire()
    assert stale not in internal(coord).pending_join
    assert (await join(coord, stale, client="gone")).error == ErrorCode.unknown_member_id


async def test_a_pending_member_id_holds_the_join_phase_until_it_joins_or_expires(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    (c_id,) = await member_ids(coord, ["c"])
    rejoin = [join(coord, a.member_id, client="c0"), join(coord, b.member_id, client="c1")]
    await settle()
    assert not any(t.done() for t in rejoin)  # all members rejoined, but c may still come
    c = join(coord, c_id, client="c")
    results = await asyncio.gather(c, *rejoin)  # it came: done, no timer needed
    assert {r.generation_id for r in results} == {2} and len(results[1].members) == 3

    # an id given out with a short session: when it lapses, the join phase ends without it
    (d_id,) = await asyncio.gather(join(coord, client="d", session_ms=1000))
    assert d_id.error == ErrorCode.member_id_required
    v2 = (("range", b"v2"),)  # new metadata: a rebalance
    rejoin = [join(coord, r.member_id, client=f"c{i}", protocols=v2) for i, r in enumerate(results)]
    await settle()
    assert not any(t.done() for t in rejoin)
    clock.advance(1000)  # before the rebalance timeout (5 s)
    coord.expire()
    await settle()
    assert {t.result().generation_id for t in rejoin} == {3}
    assert d_id.member_id not in internal(coord).pending_join


async def test_a_join_for_an_unknown_group_or_member_and_a_bad_session_timeout(
    coord: GroupCoordinator,
) -> None:
    assert (await join(coord, "someone")).error == ErrorCode.unknown_member_id
    assert GROUP not in coord._groups  # nothing made for it
    assert (await join(coord, session_ms=0)).error == ErrorCode.invalid_session_timeout
    strict = GroupCoordinator(
        clock=Clock(), min_session_timeout_ms=6000, max_session_timeout_ms=60_000
    )
    assert (await join(strict, session_ms=5999)).error == ErrorCode.invalid_session_timeout
    assert (await join(strict, session_ms=60_001)).error == ErrorCode.invalid_session_timeout
    assert (await join(coord, group="")).error == ErrorCode.invalid_group_id
    refused = await join(coord, protocols=())
    assert refused.error == ErrorCode.inconsistent_group_protocol and GROUP not in coord._groups


# -- sessions, leaves, timeouts --------------------------------------------------------------


async def test_a_member_whose_session_expires_is_removed_and_the_others_rebalance(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b, c = await stable_group(coord, clock, 3)
    clock.advance(SESSION_MS - 1000)
    assert coord.expire() == 0
    for r in (a, b):
        assert await coord.heartbeat(GROUP, 1, r.member_id) == ErrorCode.none
    clock.advance(1000)  # c said nothing for a whole session
    coord.expire()
    assert await state(coord) == "PreparingRebalance"
    assert c.member_id not in internal(coord).members
    assert await coord.heartbeat(GROUP, 1, c.member_id) == ErrorCode.unknown_member_id
    assert await coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.rebalance_in_progress
    results = await asyncio.gather(
        join(coord, a.member_id, client="c0"), join(coord, b.member_id, client="c1")
    )
    assert {r.generation_id for r in results} == {2}
    assert {m.member_id for m in results[0].members} == {a.member_id, b.member_id}


async def test_leave(coord: GroupCoordinator, clock: Clock) -> None:
    a, b = await stable_group(coord, clock, 2)
    left = await coord.leave_group(GROUP, [(b.member_id, None), ("nobody", None)])
    assert left.error == ErrorCode.none
    assert [(m.member_id, m.error) for m in left.members] == [
        (b.member_id, ErrorCode.none),
        ("nobody", ErrorCode.unknown_member_id),
    ]
    assert await state(coord) == "PreparingRebalance"
    (alone,) = await asyncio.gather(join(coord, a.member_id, client="c0"))
    assert (alone.generation_id, alone.leader, len(alone.members)) == (2, a.member_id, 1)

    # a member leaving while its JoinGroup waits: the JoinGroup is answered, not left hanging
    (d_id,) = await member_ids(coord, ["d"])
    parked = join(coord, d_id, client="d")
    await settle()
    assert (await coord.leave_group(GROUP, [(d_id, None)])).members[0].error == ErrorCode.none
    await settle()
    assert parked.result().error == ErrorCode.unknown_member_id

    # the last member leaves: the group is Empty, a generation further on
    await run_until_done(coord, clock, [join(coord, a.member_id, client="c0")])
    await coord.leave_group(GROUP, [(a.member_id, None)])
    await run_until_done(coord, clock, [])
    assert await state(coord) == "Empty" and internal(coord).generation_id == 4
    assert (
        await coord.leave_group("nope", [(a.member_id, None)])
    ).error == ErrorCode.unknown_member_id
    assert (await coord.leave_group("", [("x", None)])).error == ErrorCode.invalid_group_id


async def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    late = join(coord, client="late", version=3)
    a_again = join(coord, a.member_id, client="c0")
    await settle()
    clock.advance(REBALANCE_MS - 1)
    coord.expire()
    await settle()
    assert not late.done()  # b may still rejoin
    clock.advance(1)
    coord.expire()
    await settle()
    results = [late.result(), a_again.result()]
    assert {r.generation_id for r in results} == {2}
    assert {m.member_id for m in a_again.result().members} == {a.member_id, late.result().member_id}
    assert await coord.heartbeat(GROUP, 2, b.member_id) == ErrorCode.unknown_member_id
    # b comes back: it is a new member now
    assert (await join(coord, b.member_id, client="c1")).error == ErrorCode.unknown_member_id


async def test_the_leader_that_does_not_rejoin_is_replaced(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    b_again = join(coord, b.member_id, client="c1", protocols=(("range", b"new"),))
    (result,) = await run_until_done(coord, clock, [b_again], step_ms=REBALANCE_MS)
    assert result.leader == b.member_id and [m.member_id for m in result.members] == [b.member_id]


async def test_members_that_send_no_sync_group_within_the_rebalance_timeout_are_removed(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await form_group(coord, clock, 2)
    # the leader assigns; b never sends its SyncGroup (nor heartbeats, within its session)
    assert (await sync(coord, 1, a.member_id, assignments_for([a, b]))).error == ErrorCode.none
    clock.advance(REBALANCE_MS)
    coord.expire()
    assert await state(coord) == "PreparingRebalance"
    assert b.member_id not in internal(coord).members
    (alone,) = await run_until_done(coord, clock, [join(coord, a.member_id, client="c0")])
    assert alone.generation_id == 2 and len(alone.members) == 1


async def test_a_leader_that_never_syncs_sends_the_followers_back_to_join(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await form_group(coord, clock, 2)
    waiting = sync(coord, 1, b.member_id)
    await settle()
    clock.advance(REBALANCE_MS)
    coord.expire()
    await settle()
    assert waiting.result().error == ErrorCode.rebalance_in_progress
    assert a.member_id not in internal(coord).members


async def test_a_parked_join_group_is_answered_even_if_its_handler_went_away(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    gone = join(coord, a.member_id, client="c0")
    await settle()
    gone.cancel()  # the client hung up
    await settle()
    # the member still counts as rejoined, as in Kafka; the rebalance goes on
    (b_result,) = await asyncio.gather(join(coord, b.member_id, client="c1"))
    assert b_result.generation_id == 2 and b_result.leader == a.member_id
    # a second JoinGroup from the same member answers the first one
    first = join(coord, b.member_id, client="c1", protocols=(("range", b"x"),))
    await settle()
    second = join(coord, b.member_id, client="c1", protocols=(("range", b"x"),))
    await settle()
    assert first.result().error == ErrorCode.rebalance_in_progress and not second.done()


# -- static membership -----------------------------------------------------------------------


async def static_group(coord: GroupCoordinator, clock: Clock, version: int = 5) -> list[JoinResult]:
    tasks = [join(coord, client="a", instance="ia", version=version)]
    await settle()
    tasks.append(join(coord, client="b", instance="ib", version=version))
    results = await run_until_done(coord, clock, tasks)
    assert [r.error for r in results] == [
        ErrorCode.none
    ] * 2  # no MEMBER_ID_REQUIRED for static members
    assert results[0].member_id.startswith("ia-") and results[1].member_id.startswith("ib-")
    leader = results[0]
    await asyncio.gather(
        sync(coord, 1, leader.member_id, assignments_for(results), instance="ia"),
        sync(coord, 1, results[1].member_id, instance="ib"),
    )
    assert await state(coord) == "Stable"
    return results


async def test_a_static_member_rejoining_with_a_new_member_id_fences_the_old_one(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await static_group(coord, clock)
    # b restarts: same instance id, no member id; Stable and the protocol unchanged, so no rebalance
    b2 = await join(coord, client="b", instance="ib")
    assert (
        b2.error == ErrorCode.none
        and b2.member_id != b.member_id
        and b2.member_id.startswith("ib-")
    )
    assert (b2.generation_id, b2.leader, b2.members) == (1, a.member_id, ())
    assert await state(coord) == "Stable"
    assert await coord.heartbeat(GROUP, 1, b.member_id, "ib") == ErrorCode.fenced_instance_id
    assert (await sync(coord, 1, b.member_id, instance="ib")).error == ErrorCode.fenced_instance_id
    assert (
        await join(coord, b.member_id, client="b", instance="ib")
    ).error == ErrorCode.fenced_instance_id
    assert coord.validate_commit(GROUP, 1, b.member_id, "ib") == ErrorCode.fenced_instance_id
    # the new id carries the old one's assignment
    assert await coord.heartbeat(GROUP, 1, b2.member_id, "ib") == ErrorCode.none
    assert (
        await sync(coord, 1, b2.member_id, instance="ib")
    ).assignment == f"a-{b.member_id}".encode()
    leave = await coord.leave_group(GROUP, [(b.member_id, "ib")])
    assert leave.members[0].error == ErrorCode.fenced_instance_id


async def test_a_static_leader_rejoining_while_stable(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await static_group(coord, clock, version=9)
    a2 = await join(coord, client="a", instance="ia", version=9)
    # v9+: told it leads, with the members, but that the assignment stands
    assert (a2.leader, a2.skip_assignment, a2.generation_id) == (a2.member_id, True, 1)
    assert {m.member_id for m in a2.members} == {a2.member_id, b.member_id}
    assert {m.group_instance_id for m in a2.members} == {"ia", "ib"}
    # below v9 the old leader id is named, so that the new one does not assign
    a3 = await join(coord, client="a", instance="ia", version=8)
    assert (a3.leader, a3.skip_assignment, a3.members) == (a2.member_id, False, ())
    assert internal(coord).leader_id == a3.member_id


async def test_a_static_member_replaced_mid_rebalance_fences_its_parked_join(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await static_group(coord, clock)
    old = join(coord, b.member_id, client="b", instance="ib", protocols=(("range", b"new"),))
    await settle()
    assert await state(coord) == "PreparingRebalance"
    new = join(coord, client="b", instance="ib")
    await settle()
    assert old.result().error == ErrorCode.fenced_instance_id
    a_again = join(coord, a.member_id, client="a", instance="ia")
    results = await asyncio.gather(a_again, new)
    assert {r.generation_id for r in results} == {2}
    assert {m.member_id for m in results[0].members} == {a.member_id, new.result().member_id}


async def test_a_static_member_that_did_not_rejoin_keeps_its_place(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await static_group(coord, clock)
    b_again = join(coord, b.member_id, client="b", instance="ib", protocols=(("range", b"new"),))
    (result,) = await run_until_done(coord, clock, [b_again], step_ms=REBALANCE_MS)
    # a static member is not removed for missing the join phase (only when its session ends),
    # but a leader that did not rejoin leads no more: the first that did leads
    assert result.generation_id == 2 and result.leader == b.member_id
    assert {m.member_id for m in result.members} == {a.member_id, b.member_id}
    # and a static member may be removed by its instance id alone, as the admin client does
    left = await coord.leave_group(GROUP, [("", "ia"), ("", "nobody")])
    assert [m.error for m in left.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert a.member_id not in internal(coord).members


# -- errors of SyncGroup and Heartbeat -------------------------------------------------------


async def test_wrong_generation_and_unknown_member_on_sync_and_heartbeat(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await stable_group(coord, clock, 2)
    assert await coord.heartbeat(GROUP, 0, a.member_id) == ErrorCode.illegal_generation
    assert (await sync(coord, 2, a.member_id)).error == ErrorCode.illegal_generation
    assert await coord.heartbeat(GROUP, 1, "stranger") == ErrorCode.unknown_member_id
    assert (await sync(coord, 1, "stranger")).error == ErrorCode.unknown_member_id
    assert await coord.heartbeat("other", 1, a.member_id) == ErrorCode.unknown_member_id
    assert (await coord.sync_group("other", 1, a.member_id)).error == ErrorCode.unknown_member_id
    assert await coord.heartbeat("", 1, a.member_id) == ErrorCode.invalid_group_id
    # the instance id must be the member's (a dynamic member has none)
    assert await coord.heartbeat(GROUP, 1, a.member_id, "ia") == ErrorCode.unknown_member_id
    assert (await sync(coord, 1, a.member_id, protocol_name="roundrobin")).error == (
        ErrorCode.inconsistent_group_protocol
    )
    assert (await coord.sync_group(GROUP, 1, a.member_id, protocol_type="connect")).error == (
        ErrorCode.inconsistent_group_protocol
    )
    assert (await sync(coord, 1, a.member_id, protocol_name="range")).error == ErrorCode.none


# -- DescribeGroups, ListGroups, DeleteGroups ------------------------------------------------


async def test_describe_list_and_delete(coord: GroupCoordinator, clock: Clock) -> None:
    a, b = await stable_group(coord, clock, 2)
    (d,) = await coord.describe_groups([GROUP])
    assert (d.error, d.state, d.protocol_type, d.protocol_data) == (
        ErrorCode.none,
        "Stable",
        "consumer",
        "range",
    )
    assert [
        (m.member_id, m.client_id, m.client_host, m.metadata, m.assignment) for m in d.members
    ] == [
        (a.member_id, "c0", "/host-c0", b"range-meta", f"a-{a.member_id}".encode()),
        (b.member_id, "c1", "/host-c1", b"range-meta", f"a-{b.member_id}".encode()),
    ]
    (unknown,) = await coord.describe_groups(["nope"])
    assert (unknown.error, unknown.state, unknown.members) == (ErrorCode.none, "Dead", ())

    await run_until_done(coord, clock, [join(coord, client="x", version=3, group="other")])
    listed = await coord.list_groups()
    assert listed.error == ErrorCode.none
    assert sorted((g.group_id, g.state, g.protocol_type, g.group_type) for g in listed.groups) == [
        (GROUP, "Stable", "consumer", "classic"),
        ("other", "CompletingRebalance", "consumer", "classic"),
    ]
    assert [g.group_id for g in (await coord.list_groups(["STABLE", "empty"])).groups] == [GROUP]
    assert (await coord.list_groups(types_filter=["consumer"])).groups == ()
    assert len((await coord.list_groups(types_filter=["Classic"])).groups) == 2

    # while rebalancing, members are described without metadata or assignment
    join(coord, a.member_id, client="c0", protocols=(("range", b"changed"),))
    await settle()
    (d,) = await coord.describe_groups([GROUP])
    assert d.state == "PreparingRebalance" and d.protocol_data == ""
    assert all(m.metadata == b"" and m.assignment == b"" for m in d.members)

    assert await coord.delete_groups([GROUP, "nope"]) == {
        GROUP: ErrorCode.non_empty_group,
        "nope": ErrorCode.group_id_not_found,
    }
    await coord.leave_group(GROUP, [(a.member_id, None), (b.member_id, None)])
    await run_until_done(coord, clock, [])
    assert await state(coord) == "Empty"
    (pending,) = await member_ids(coord, ["p"])  # a pending id does not keep a group alive
    assert await coord.delete_groups([GROUP]) == {GROUP: ErrorCode.none}
    assert await state(coord) == "Dead"
    assert GROUP not in [g.group_id for g in (await coord.list_groups()).groups]
    assert (await join(coord, pending, client="p")).error == ErrorCode.unknown_member_id
    assert {key[1] for key in coord._timer._live} == {"other"}  # the deleted group left no timer


# -- OffsetCommit validation -----------------------------------------------------------------


async def test_validate_commit(coord: GroupCoordinator, clock: Clock) -> None:
    # a group unknown here: a simple commit (generation -1) is fine, a member's is not
    assert coord.validate_commit("simple", -1, "") == ErrorCode.none
    assert coord.validate_commit("simple", 3, "m") == ErrorCode.illegal_generation
    assert coord.validate_commit("simple", 3, "m", api_version=9) == ErrorCode.group_id_not_found
    a, b = await form_group(coord, clock, 2)
    # waiting for the assignment: commit after the SyncGroup
    assert coord.validate_commit(GROUP, 1, a.member_id) == ErrorCode.rebalance_in_progress
    assert coord.validate_commit(GROUP, 1, a.member_id, transactional=True) == ErrorCode.none
    await asyncio.gather(
        sync(coord, 1, a.member_id, assignments_for([a, b])), sync(coord, 1, b.member_id)
    )
    assert coord.validate_commit(GROUP, 1, a.member_id) == ErrorCode.none
    assert coord.validate_commit(GROUP, 0, a.member_id) == ErrorCode.illegal_generation
    assert coord.validate_commit(GROUP, 1, "stranger") == ErrorCode.unknown_member_id
    assert (
        coord.validate_commit(GROUP, -1, "") == ErrorCode.unknown_member_id
    )  # the group has members
    assert coord.validate_commit("", -1, "") == ErrorCode.none  # the empty group id is allowed here
    # a commit is a sign of life: it extends the session
    clock.advance(SESSION_MS - 1)
    assert coord.validate_commit(GROUP, 1, b.member_id) == ErrorCode.none
    assert await coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.none
    clock.advance(2)
    coord.expire()
    assert await state(coord) == "Stable"
    # still accepted while the group gathers members (the heartbeat tells the member to rejoin)
    join(coord, a.member_id, client="c0", protocols=(("range", b"changed"),))
    await settle()
    assert coord.validate_commit(GROUP, 1, b.member_id) == ErrorCode.none


# -- bounds and shutdown ---------------------------------------------------------------------


async def test_group_max_size(clock: Clock) -> None:
    coord = GroupCoordinator(
        clock=clock, initial_rebalance_delay_ms=DELAY_MS, min_session_timeout_ms=1, group_max_size=2
    )
    results = await run_until_done(coord, clock, [join(coord, client=c, version=3) for c in "ab"])
    full = await join(coord, client="c", version=3)
    assert (full.error, full.member_id) == (ErrorCode.group_max_size_reached, "")
    # members already in are still accepted
    assert (await join(coord, results[1].member_id, client="b", version=3)).error == ErrorCode.none
    # pending member ids are bounded too
    other = GroupCoordinator(clock=clock, min_session_timeout_ms=1, group_max_size=2)
    firsts = [await join(other, client=c, version=4) for c in "abc"]
    assert [r.error for r in firsts] == [ErrorCode.member_id_required] * 2 + [
        ErrorCode.group_max_size_reached
    ]
    assert len(other._groups[GROUP].pending_join) == 2


async def test_idle_groups_are_bounded(clock: Clock) -> None:
    coord = GroupCoordinator(
        clock=clock,
        initial_rebalance_delay_ms=DELAY_MS,
        min_session_timeout_ms=1,
        max_idle_groups=2,
    )

    async def once(group: str) -> None:
        """A member joins, then leaves: the group is Empty, nothing pending."""
        (joined,) = await run_until_done(coord, clock, [join(coord, version=3, group=group)])
        await coord.leave_group(group, [(joined.member_id, None)])

    for group in ("a", "b"):
        await once(group)
    assert [g.group_id for g in (await coord.list_groups()).groups] == ["a", "b"]
    assert coord._groups["a"].generation_id == 2  # kept: its generation goes on
    await run_until_done(coord, clock, [join(coord, version=3, group="a")])  # a is busy again
    await once("c")
    await once("d")  # b was idle longest: forgotten
    assert sorted(g.group_id for g in (await coord.list_groups()).groups) == ["a", "c", "d"]
    assert await state(coord, "b") == "Dead"
    (again,) = await run_until_done(coord, clock, [join(coord, version=3, group="b")])
    assert again.generation_id == 1  # a new start
    # a group waiting on a member id given out is not idle
    (pending,) = await asyncio.gather(join(coord, version=4, group="e"))
    assert pending.error == ErrorCode.member_id_required and "e" in coord._groups
    assert "e" not in coord._idle


async def test_close_answers_every_parked_request_and_later_calls(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = await form_group(coord, clock, 2)
    parked_sync = sync(coord, 1, b.member_id)
    parked_join = join(coord, client="late", version=3, group="other")
    loop_task = coord.start()
    await settle()
    coord.close()
    await settle()
    assert parked_sync.result().error == ErrorCode.not_coordinator
    assert parked_join.result().error == ErrorCode.not_coordinator
    await asyncio.wait_for(loop_task, 1)
    assert (await join(coord, client="x")).error == ErrorCode.coordinator_not_available
    assert (await sync(coord, 1, a.member_id)).error == ErrorCode.coordinator_not_available
    assert await coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.coordinator_not_available
    assert (
        await coord.leave_group(GROUP, [(a.member_id, None)])
    ).error == ErrorCode.coordinator_not_available
    assert (await coord.list_groups()).error == ErrorCode.coordinator_not_available
    assert (await coord.describe_groups([GROUP]))[0].error == ErrorCode.coordinator_not_available
    assert await coord.delete_groups([GROUP]) == {GROUP: ErrorCode.coordinator_not_available}
    assert coord.validate_commit(GROUP, 1, a.member_id) == ErrorCode.coordinator_not_available


async def test_the_timer_loop_fires_deadlines_on_the_real_clock() -> None:
    coord = GroupCoordinator(initial_rebalance_delay_ms=20, min_session_timeout_ms=1)
    coord.start()
    try:
        joined = await asyncio.wait_for(
            join(coord, client="a", version=3, session_ms=60, rebalance_ms=60), 2
        )
        assert joined.generation_id == 1
        synced = await sync(coord, 1, joined.member_id, [(joined.member_id, b"x")])
        assert synced.assignment == b"x"
        for _ in range(100):  # no heartbeat: the session ends, the group empties
            await asyncio.sleep(0.01)
            if await state(coord) == "Empty":
                break
        assert await state(coord) == "Empty"
    finally:
        coord.close()


def test_the_timer_replaces_a_key_and_keeps_its_heap_small() -> None:
    from broker.coordinator import _Timer

    timer, fired = _Timer(), []
    for i in range(10_000):
        timer.schedule("k", float(i), lambda i=i: fired.append(i))
    assert len(timer) == 1 and len(timer._heap) < 200
    timer.schedule("j", 5.0, lambda: fired.append("j"))
    mark = timer.mark()
    while (callback := timer.pop_due(10_000.0, mark)) is not None:
        callback()
    assert fired == ["j", 9999]
    timer.schedule("k", 1.0, lambda: fired.append("late"))
    assert timer.pop_due(2.0, mark) is None  # scheduled after the mark: the next step's


# -- a state machine over all of it ----------------------------------------------------------


STATIC = "is"  # the one static member's group instance id
CLIENTS = 5  # c0..c3 dynamic, c4 static


def identity(member_id: str) -> str:
    """Who a member id is: the static instance across its restarts, else the id itself (a
    dynamic member that rejoins with a new id is a new member)."""
    return STATIC if member_id.startswith(f"{STATIC}-") else member_id


class Client:
    """What one consumer knows: its member id, its generation, the members it leads, its
    request in flight."""

    def __init__(self, name: str, instance: str | None = None) -> None:
        self.name = name
        self.instance = instance
        self.member_id = ""
        self.generation = -1
        self.members: tuple[str, ...] = ()
        self.task: asyncio.Task | None = None
        self.kind = ""

    def forget(self) -> None:
        self.member_id, self.generation, self.members = "", -1, ()


class CoordinatorMachine(RuleBasedStateMachine):
    """Consumers joining, syncing, heartbeating, leaving and going silent on a fake clock, four
    dynamic and one static that also restarts (rejoining with no member id, which fences its old
    id). Checked: one leader (identity) per generation, generations only grow, each member's
    assignment is the one its generation's leader gave, every parked request is answered, and
    the group's own bookkeeping agrees with itself."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.coord = GroupCoordinator(
            clock=self.clock, initial_rebalance_delay_ms=50, min_session_timeout_ms=1
        )
        self.clients = [Client(f"c{i}") for i in range(CLIENTS - 1)] + [Client("c4", STATIC)]
        self.orphans: list[asyncio.Task] = []  # requests of the static client before a restart
        self.old_ids: list[tuple[str, int]] = []  # its member ids before, with their generation
        self.leaders: dict[int, str] = {}  # generation -> the leader's identity
        self.given: dict[int, dict[str, bytes]] = {}  # generation -> identity -> assignment
        self.last_generation = 0

    def teardown(self) -> None:
        self.coord.close()
        self.loop.run_until_complete(asyncio.sleep(0))
        for task in [c.task for c in self.clients if c.task is not None] + self.orphans:
            assert task.done()  # close() answered it
        self.loop.close()

    def _start(self, client: Client, kind: str, coro: Coroutine) -> None:
        client.task, client.kind = self.loop.create_task(coro), kind

    def _settle(self) -> None:
        async def turns() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())
        for client in self.clients:
            if client.task is not None and client.task.done():
                result, kind = client.task.result(), client.kind
                client.task = None
                self._joined(client, result) if kind == "join" else self._synced(client, result)
        for orphan in [t for t in self.orphans if t.done()]:
            # parked when its client restarted: fenced by the new member id
            assert orphan.result().error == ErrorCode.fenced_instance_id, orphan.result()
            self.orphans.remove(orphan)

    def _joined(self, client: Client, result: JoinResult) -> None:
        if result.error == ErrorCode.none:
            assert result.generation_id >= client.generation
            leader = self.leaders.setdefault(result.generation_id, identity(result.leader))
            assert leader == identity(result.leader)
            assert bool(result.members) == (result.member_id == result.leader)
            client.member_id, client.generation = result.member_id, result.generation_id
            client.members = tuple(m.member_id for m in result.members)
        elif result.error == ErrorCode.member_id_required:
            assert client.instance is None
            client.member_id = result.member_id
        elif result.error == ErrorCode.unknown_member_id:
            client.forget()
        else:
            assert result.error == ErrorCode.rebalance_in_progress, result

    def _synced(self, client: Client, result: SyncResult) -> None:
        if result.error == ErrorCode.none:
            expected = self.given[client.generation].get(identity(client.member_id), b"")
            assert result.assignment == expected
        elif result.error == ErrorCode.unknown_member_id:
            client.forget()
        else:
            assert result.error in (
                ErrorCode.rebalance_in_progress,
                ErrorCode.illegal_generation,
            ), result

    def _join(self, client: Client, meta: bytes, version: int) -> None:
        self._start(
            client,
            "join",
            self.coord.join_group(
                GROUP,
                client.member_id,
                version=version,
                client_id=client.name,
                client_host="h",
                session_timeout_ms=1000,
                rebalance_timeout_ms=500,
                protocol_type="consumer",
                protocols=[("range", meta)],
                group_instance_id=client.instance,
            ),
        )

    @rule(
        i=st.integers(0, CLIENTS - 1),
        meta=st.sampled_from([b"x", b"y"]),
        version=st.sampled_from([3, 5, 9]),
    )
    def join(self, i: int, meta: bytes, version: int) -> None:
        client = self.clients[i]
        if client.task is None:
            self._join(client, meta, max(version, 5) if client.instance else version)
        self._settle()

    @rule(
        meta=st.sampled_from([b"x", b"y"]),
        version=st.sampled_from([5, 9]),
        now=st.integers(0, 3),
    )
    def restart_the_static_member(self, meta: bytes, version: int, now: int) -> None:
        if now:  # one time in four: a restart mid-rebalance starts another one
            return
        old = self.clients[-1]
        if old.task is not None:
            self.orphans.append(old.task)
        if old.member_id:
            self.old_ids.append((old.member_id, old.generation))
        new = self.clients[-1] = Client(old.name, STATIC)
        self._join(new, meta, version)
        self._settle()

    def _sync(self, client: Client, omit: set[int]) -> None:
        assignments = [
            (m, f"{client.generation}/{identity(m)}".encode())
            for n, m in enumerate(client.members)
            if n not in omit
        ]
        if client.members:
            given = {identity(m): data for m, data in assignments}
            self.given.setdefault(client.generation, given)
        self._start(
            client,
            "sync",
            self.coord.sync_group(
                GROUP,
                client.generation,
                client.member_id,
                group_instance_id=client.instance,
                assignments=assignments,
            ),
        )

    @rule(i=st.integers(0, CLIENTS - 1), omit=st.sets(st.integers(0, CLIENTS - 1)))
    def sync(self, i: int, omit: set[int]) -> None:
        client = self.clients[i]
        if client.task is None and client.generation >= 0:
            self._sync(client, omit)
        self._settle()

    @rule(meta=st.sampled_from([b"x", b"y"]), version=st.sampled_from([3, 5, 9]))
    def everyone_joins(self, meta: bytes, version: int) -> None:
        """A well-behaved group: every client not waiting joins (or rejoins) at once."""
        for client in self.clients:
            if client.task is None:
                self._join(client, meta, max(version, 5) if client.instance else version)
        self._settle()

    @rule(leader_last=st.booleans(), omit=st.sets(st.integers(0, CLIENTS - 1)))
    def everyone_syncs(self, leader_last: bool, omit: set[int]) -> None:
        """Every client not waiting, with a generation, sends its SyncGroup at once."""
        idle = [c for c in self.clients if c.task is None and c.generation >= 0]
        for client in sorted(idle, key=lambda c: bool(c.members) == leader_last):
            self._sync(client, omit)
        self._settle()

    @rule(i=st.integers(0, CLIENTS - 1))
    def heartbeat(self, i: int) -> None:
        client = self.clients[i]
        if client.member_id and client.task is None:
            error = self.loop.run_until_complete(
                self.coord.heartbeat(GROUP, client.generation, client.member_id, client.instance)
            )
            assert error in (
                ErrorCode.none,
                ErrorCode.rebalance_in_progress,
                ErrorCode.unknown_member_id,
                ErrorCode.illegal_generation,
            )
            if error == ErrorCode.unknown_member_id:
                client.forget()
        self._settle()

    @rule(i=st.integers(0, CLIENTS - 1))
    def leave(self, i: int) -> None:
        client = self.clients[i]
        if client.member_id:
            left = self.loop.run_until_complete(
                self.coord.leave_group(GROUP, [(client.member_id, client.instance)])
            )
            assert left.error in (ErrorCode.none, ErrorCode.unknown_member_id)
            if client.task is None:
                client.forget()
        self._settle()

    @precondition(lambda self: self.old_ids)
    @rule(data=st.data())
    def an_old_static_member_id_calls(self, data: st.DataObject) -> None:
        """The instance before a restart still heartbeats: fenced while another member id holds
        the instance, unknown once none does."""
        member_id, generation = data.draw(st.sampled_from(self.old_ids))
        group = self.coord._groups.get(GROUP)
        holder = group.static_members.get(STATIC) if group is not None else None
        error = self.loop.run_until_complete(
            self.coord.heartbeat(GROUP, generation, member_id, STATIC)
        )
        if holder is None:
            assert error == ErrorCode.unknown_member_id
        else:
            assert holder != member_id and error == ErrorCode.fenced_instance_id
        self._settle()

    @rule(ms=st.sampled_from([10, 50, 200, 600, 1200]))
    def wait(self, ms: int) -> None:
        self.clock.advance(ms)
        self.coord.expire()
        self._settle()

    @precondition(lambda self: GROUP in self.coord._groups)
    @invariant()
    def group_is_consistent(self) -> None:
        group = self.coord._groups[GROUP]
        assert group.generation_id >= self.last_generation
        self.last_generation = group.generation_id
        if group.state is GroupState.EMPTY:
            assert not group.members
        if not group.members:  # a rebalance may wait for pending member ids with no member left
            assert group.state in (GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
        else:
            assert group.leader_id in group.members
        assert group.awaiting_join == sum(m.join_waiter is not None for m in group.members.values())
        expected = sum((Counter(m.protocol_names()) for m in group.members.values()), Counter())
        assert group.supported_protocols == expected
        assert set(group.pending_sync) <= set(group.members)
        assert not set(group.pending_join) & set(group.members)
        for group_id in self.coord._idle:  # only idle groups are listed as such
            idle = self.coord._groups[group_id]
            assert idle.state is GroupState.EMPTY and not idle.members and not idle.pending_join
        assert group.static_members == {
            m.group_instance_id: m.member_id for m in group.members.values() if m.is_static
        }
        if group.state is GroupState.STABLE:
            given = self.given[group.generation_id]
            for member in group.members.values():
                assert member.assignment == given.get(identity(member.member_id), b"")
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            leader = identity(group.leader_id or "")
            assert self.leaders.setdefault(group.generation_id, leader) == leader


TestCoordinatorMachine = CoordinatorMachine.TestCase
TestCoordinatorMachine.settings = settings(
    max_examples=50,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
