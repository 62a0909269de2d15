"""The classic consumer-group coordinator: Kafka's JoinGroup / SyncGroup / Heartbeat / LeaveGroup
state machine, held in memory on one asyncio event loop.

This is Kafka's `GroupCoordinator` (core/.../coordinator/group/GroupCoordinator.scala) and its
successor for the classic protocol (group-coordinator/.../GroupMetadataManager.java with
`classic/ClassicGroup.java`), with Kafka's names, states, error codes and decisions; where the two
differ, the newer one is followed (heartbeats in CompletingRebalance extend the session, members
that never send SyncGroup are removed after the rebalance timeout, a static member rejoining while
Stable is answered without a rebalance). What it does not do, and why:

- It writes nothing: Kafka appends the group's metadata to __consumer_offsets so that another
  broker can take the group over; here a group lives and dies with its process, like a coordinator
  whose partition moves. A restart makes every member rejoin (they get UNKNOWN_MEMBER_ID), which
  clients handle; committed offsets are the engine's and survive.
- It is the coordinator of every group it is asked about: which process owns a group (the
  FindCoordinator answer) is the listener's decision.

The API takes plain values and returns small frozen dataclasses, never kio objects, so that the
wire handlers translate per version. `join_group` and `sync_group` wait (a JoinGroup is parked
until the rebalance completes, a follower's SyncGroup until the leader's assignment arrives); the
other methods answer at once. Every state change happens synchronously inside one call, between
two awaits of the event loop, so no lock is needed and no call sees half a transition.

Time: every deadline (a member's session, a pending member id, the join phase, the sync phase) is
an entry of one timer keyed as Kafka keys its timer tasks (a new deadline for the same key
replaces the old one), on an injectable monotonic clock in milliseconds (Kafka's
Time.milliseconds). `expire()` runs what is due; `run()` (or `start()`) is the loop that calls it
when the next deadline comes. Tests drive `expire()` on a fake clock and never sleep.

Memory is bounded: a group holds at most `group_max_size` members (GROUP_MAX_SIZE_REACHED past
it) and as many pending member ids (given out with MEMBER_ID_REQUIRED, each dropped after its
session timeout); at most `max_idle_groups` groups are kept Empty with nothing pending, the
longest idle forgotten first; a parked JoinGroup or SyncGroup always ends: completed, superseded
by the same member's next request, failed when its member is removed, or failed by `close()`.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from kio.schema.errors import ErrorCode

logger = logging.getLogger("eventlog.kafka")

UNKNOWN_MEMBER_ID = ""  # JoinGroupRequest.UNKNOWN_MEMBER_ID
NO_GENERATION = -1
NO_LEADER = ""
CLASSIC = "classic"  # ListGroups v5's group type

# Kafka's defaults, each a constructor parameter
DEFAULT_INITIAL_REBALANCE_DELAY_MS = 3_000  # group.initial.rebalance.delay.ms
DEFAULT_MIN_SESSION_TIMEOUT_MS = 6_000  # group.min.session.timeout.ms
DEFAULT_MAX_SESSION_TIMEOUT_MS = 1_800_000  # group.max.session.timeout.ms
DEFAULT_NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000  # GroupCoordinator.NewMemberJoinTimeoutMs
# group.max.size is unbounded in Kafka; here it also bounds the pending member ids, so finite
DEFAULT_GROUP_MAX_SIZE = 10_000
# Empty groups with nothing pending kept for ListGroups / DescribeGroups (Kafka keeps each until
# its offsets expire; here the offsets are the engine's)
DEFAULT_MAX_IDLE_GROUPS = 10_000

# JoinGroup versions: MEMBER_ID_REQUIRED from v4 (KIP-394), skip_assignment from v9 (KIP-814)
JOIN_REQUIRES_KNOWN_MEMBER_ID_VERSION = 4
JOIN_SUPPORTS_SKIP_ASSIGNMENT_VERSION = 9
# OffsetCommit answers GROUP_ID_NOT_FOUND for an unknown group from v9 (ILLEGAL_GENERATION before)
OFFSET_COMMIT_GROUP_ID_NOT_FOUND_VERSION = 9


class GroupState(Enum):
    """A classic group's state; the value is Kafka's name for it, as DescribeGroups and ListGroups
    answer it."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# ClassicGroupState's validPreviousStates
_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinedMember:
    """One member as the leader's JoinGroup response lists it: its metadata for the chosen
    protocol."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    """A JoinGroup answer. `members` is non-empty for the leader only (and for a static leader
    rejoining while Stable at v9+, with `skip_assignment`). On an error, `member_id` is what the
    client must use next: the new id with MEMBER_ID_REQUIRED, "" with UNKNOWN_MEMBER_ID after a
    removal or GROUP_MAX_SIZE_REACHED. `protocol_type` and `protocol_name` are None where Kafka's
    response has null (below v7 the wire has no null name: write "")."""

    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = NO_LEADER
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    """A SyncGroup answer: the member's assignment (opaque bytes) and, from v5, the group's
    protocol type and name (None on an error)."""

    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveMemberResult:
    """One member of a LeaveGroup (v3+), echoed with its own error."""

    member_id: str
    group_instance_id: str | None
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """A LeaveGroup answer. Below v3 the request names one member and the response has only the
    top-level error: answer `error` if it is not NONE, else `members[0].error`."""

    error: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member in DescribeGroups; metadata and assignment are empty unless the group is
    Stable, as Kafka's GroupMetadata.summary."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """One group in DescribeGroups. An unknown group is described as Kafka describes it: state
    "Dead", no error (from DescribeGroups v6 Kafka answers GROUP_ID_NOT_FOUND for it instead;
    that is the handler's choice, with what the engine knows of the group's offsets).
    `protocol_data` is the chosen protocol's name while Stable, else ""."""

    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str
    protocol_data: str
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One group in ListGroups."""

    group_id: str
    protocol_type: str
    state: str
    group_type: str = CLASSIC


@dataclass(frozen=True, slots=True)
class ListGroupsResult:
    error: ErrorCode
    groups: tuple[GroupListing, ...] = ()


def _monotonic_ms() -> float:
    return time.monotonic_ns() / 1_000_000


def _join_error(member_id: str, error: ErrorCode) -> JoinResult:
    return JoinResult(error=error, member_id=member_id)


# -- the timer ----------------------------------------------------------------------------------


class _Timer:
    """Deadlines keyed as Kafka's coordinator timer keys them: scheduling a key again replaces
    its deadline, cancelling drops it. A heap with lazy deletion; stale entries are compacted away
    when they outnumber the live ones, so rescheduling a heartbeat per member per beat stays
    bounded."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._live: dict[Hashable, tuple[float, int, Callable[[], None]]] = {}
        self._seq = itertools.count()

    def schedule(self, key: Hashable, deadline: float, callback: Callable[[], None]) -> None:
        seq = next(self._seq)
        self._live[key] = (deadline, seq, callback)
        heapq.heappush(self._heap, (deadline, seq, key))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [(d, s, k) for k, (d, s, _) in self._live.items()]
            heapq.heapify(self._heap)

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def mark(self) -> int:
        """A sequence number: entries scheduled after this call are numbered at or above it."""
        seq = next(self._seq)
        return seq

    def next_deadline(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, before: int) -> Callable[[], None] | None:
        """The callback of the earliest entry due at `now` and scheduled before `before`."""
        self._drop_stale()
        if not self._heap:
            return None
        deadline, seq, key = self._heap[0]
        if deadline > now or seq >= before:
            return None
        heapq.heappop(self._heap)
        return self._live.pop(key)[2]

    def _drop_stale(self) -> None:
        heap, live = self._heap, self._live
        while heap:
            _, seq, key = heap[0]
            entry = live.get(key)
            if entry is not None and entry[1] == seq:
                return
            heapq.heappop(heap)

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()

    def __len__(self) -> int:
        return len(self._live)


def _heartbeat_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("heartbeat", group_id, member_id)


def _join_key(group_id: str) -> tuple[str, str]:
    return ("join", group_id)


def _sync_key(group_id: str) -> tuple[str, str]:
    return ("sync", group_id)


# -- a group and its members --------------------------------------------------------------------


def _complete(waiter: asyncio.Future, result: object) -> None:
    """Answer a parked request unless its handler is gone (a cancelled future: the client hung
    up); Kafka drops such a response the same way."""
    if not waiter.done():
        waiter.set_result(result)


class _Member:
    """ClassicGroupMember: what a member said in its last JoinGroup, its assignment, and its
    parked JoinGroup / SyncGroup, if any."""

    __slots__ = (
        "member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout_ms",
        "session_timeout_ms", "protocol_type", "protocols", "assignment", "join_waiter",
        "sync_waiter", "is_new",
    )

    def __init__(
        self, member_id: str, group_instance_id: str | None, client_id: str, client_host: str,
        rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
        protocols: tuple[tuple[str, bytes], ...], assignment: bytes = b"",
    ) -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assignment = assignment
        self.join_waiter: asyncio.Future | None = None
        self.sync_waiter: asyncio.Future | None = None
        self.is_new = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        """Whether a JoinGroup carries the same protocols and metadata, in the same order."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among the candidates (its own order)."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise RuntimeError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """ClassicGroupMember.hasSatisfiedHeartbeat: a member parked in a rebalance counts as
        alive (it cannot heartbeat while its JoinGroup or SyncGroup waits), unless it is new (it
        has no member id to heartbeat with yet; the new-member join timeout bounds it)."""
        if self.is_new:
            return False
        return self.join_waiter is not None or self.sync_waiter is not None


class _Group:
    """ClassicGroup: the state of one group. Pure bookkeeping; the coordinator decides."""

    def __init__(self, group_id: str, now: float) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.previous_state = GroupState.DEAD
        self.state_timestamp = now
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, _Member] = {}  # in join order: the first is the next leader
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.pending_join: dict[str, None] = {}  # member ids given with MEMBER_ID_REQUIRED
        self.pending_sync: dict[str, None] = {}  # members yet to send SyncGroup this generation
        self.awaiting_join = 0  # members with a parked JoinGroup
        self.supported_protocols: Counter[str] = Counter()
        self.new_member_added = False

    # -- states

    def transition_to(self, state: GroupState, now: float) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise RuntimeError(
                f"group {self.group_id}: no transition from {self.state.value} to {state.value}"
            )
        self.previous_state, self.state, self.state_timestamp = self.state, state, now

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    # -- members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: _Member, waiter: asyncio.Future | None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(f"static member {member.group_instance_id} is already in")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        member.join_waiter = waiter
        if waiter is not None:
            self.awaiting_join += 1
        self.pending_join.pop(member.member_id, None)

    def remove(self, member_id: str) -> _Member | None:
        """Drop a member (or a pending member id); a new leader is the first member left."""
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names())
            self.supported_protocols += Counter()  # drop the zero counts
            if member.join_waiter is not None:
                self.awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join.pop(member_id, None)
        self.pending_sync.pop(member_id, None)
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> _Member:
        """A static member rejoined with a new member id: the old id is fenced (its parked
        requests answer FENCED_INSTANCE_ID), everything else carries over."""
        old = self.members.pop(old_id)
        self.complete_join(old, _join_error(old_id, ErrorCode.fenced_instance_id))
        self.complete_sync(old, SyncResult(ErrorCode.fenced_instance_id))
        new = _Member(
            new_id, old.group_instance_id, old.client_id, old.client_host, old.rebalance_timeout_ms,
            old.session_timeout_ms, old.protocol_type, old.protocols, old.assignment,
        )
        self.members[new_id] = new
        if self.is_leader(old_id):
            self.leader_id = new_id
        if old_id in self.pending_sync:  # the new id owes the SyncGroup the old one did
            del self.pending_sync[old_id]
            self.pending_sync[new_id] = None
        self.static_members[instance_id] = new_id
        return new

    def update_member(
        self, member: _Member, protocols: tuple[tuple[str, bytes], ...], rebalance_timeout_ms: int,
        session_timeout_ms: int, waiter: asyncio.Future | None,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names())
        member.protocols = protocols
        self.supported_protocols.update(member.protocol_names())
        self.supported_protocols += Counter()
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        previous = member.join_waiter
        if previous is not None and previous is not waiter:
            # the same member joined again while its first JoinGroup waits (a retry after a
            # client-side timeout): the first one is answered, so that no handler waits forever
            _complete(previous, _join_error(member.member_id, ErrorCode.rebalance_in_progress))
        if waiter is not None and previous is None:
            self.awaiting_join += 1
        elif waiter is None and previous is not None:
            self.awaiting_join -= 1
        member.join_waiter = waiter

    def complete_join(self, member: _Member, result: JoinResult) -> bool:
        waiter = member.join_waiter
        if waiter is None:
            return False
        _complete(waiter, result)
        member.join_waiter = None
        self.awaiting_join -= 1
        return True

    def complete_sync(self, member: _Member, result: SyncResult) -> bool:
        waiter = member.sync_waiter
        if waiter is None:
            return False
        _complete(waiter, result)
        member.sync_waiter = None
        return True

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.awaiting_join and not self.pending_join

    def not_yet_rejoined(self) -> list[_Member]:
        return [m for m in self.members.values() if m.join_waiter is None]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """ClassicGroup.validateMember: the instance id, if given, must map to this member id
        (FENCED_INSTANCE_ID if another one holds it), and the member must be in the group."""
        if instance_id is not None:
            holder = self.static_members.get(instance_id)
            if holder is None:
                return ErrorCode.unknown_member_id
            if holder != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return None

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else make the first member that rejoined the leader;
        False if none did (or the group has no leader)."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].join_waiter is not None:
            return True
        for member in self.members.values():
            if member.join_waiter is not None:
                logger.info(
                    "group %s: leader %s did not rejoin in time; %s is the new leader",
                    self.group_id, self.leader_id, member.member_id,
                )
                self.leader_id = member.member_id
                return True
        return False

    # -- protocols

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        """Whether a member with these protocols may join: any protocol type and at least one
        protocol while Empty; else the group's type and a protocol every member supports."""
        names = list(names)
        if self.state is GroupState.EMPTY:
            return protocol_type != "" and bool(names)
        size = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols.get(name, 0) == size for name in names
        )

    def select_protocol(self) -> str:
        """The protocol every member supports with the most votes, each member voting for its
        most preferred candidate (Kafka breaks a tie arbitrarily; here the first voted wins)."""
        if not self.members:
            raise RuntimeError(f"group {self.group_id}: no protocol for an empty group")
        size = len(self.members)
        candidates = {name for name, count in self.supported_protocols.items() if count == size}
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return max(votes, key=lambda name: votes[name])

    def init_next_generation(self, now: float) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now)
        self.pending_sync.clear()

    def current_members(self) -> tuple[JoinedMember, ...]:
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def join_result(self, member_id: str, *, members: bool, leader: str | None = None,
                    skip_assignment: bool = False) -> JoinResult:
        return JoinResult(
            error=ErrorCode.none,
            member_id=member_id,
            generation_id=self.generation_id,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader=(self.leader_id if leader is None else leader) or NO_LEADER,
            skip_assignment=skip_assignment,
            members=self.current_members() if members else (),
        )

    def describe(self) -> GroupDescription:
        stable = self.state is GroupState.STABLE
        members = tuple(
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(self.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in self.members.values()
        )
        return GroupDescription(
            group_id=self.group_id,
            error=ErrorCode.none,
            state=self.state.value,
            protocol_type=self.protocol_type or "",
            protocol_data=(self.protocol_name or "") if stable else "",
            members=members,
        )


@dataclass(frozen=True, slots=True)
class _JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    version: int
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    reason: str | None


def _dedup_protocols(protocols: Iterable[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    """The protocols in the client's order of preference, each name once (its first entry),
    as Kafka's JoinGroupRequestProtocolCollection keys them by name."""
    seen: dict[str, bytes] = {}
    for name, metadata in protocols:
        seen.setdefault(name, bytes(metadata))
    return tuple(seen.items())


# -- the coordinator ----------------------------------------------------------------------------


class GroupCoordinator:
    """Kafka's group coordinator for the classic protocol, for every group of this process.

    `clock` is a monotonic clock in milliseconds, as every timeout here is (Kafka's); the
    default reads time.monotonic_ns. Call `start()` (or run `run()` in a task group) on the
    serving loop so that deadlines fire on their own; tests call `expire()` instead.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = _monotonic_ms,
        initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS,
        min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
        group_max_size: int = DEFAULT_GROUP_MAX_SIZE,
        new_member_join_timeout_ms: int = DEFAULT_NEW_MEMBER_JOIN_TIMEOUT_MS,
        max_idle_groups: int = DEFAULT_MAX_IDLE_GROUPS,
    ) -> None:
        if group_max_size < 1 or max_idle_groups < 0:
            raise ValueError("group_max_size must be at least 1, max_idle_groups at least 0")
        self._clock = clock
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.group_max_size = group_max_size
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self.max_idle_groups = max_idle_groups
        self._groups: dict[str, _Group] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # idle groups, longest idle first
        self._timer = _Timer()
        self._closed = False
        self._now_override: float | None = None
        self._wake = asyncio.Event()
        self._sleeping_until: float | None = None
        self._task: asyncio.Task | None = None

    # -- time

    def _now(self) -> float:
        return self._clock() if self._now_override is None else self._now_override

    def _schedule(self, key: Hashable, delay_ms: float, callback: Callable[[], None]) -> None:
        deadline = self._now() + delay_ms
        self._timer.schedule(key, deadline, callback)
        if self._sleeping_until is None or deadline < self._sleeping_until:
            self._wake.set()

    def expire(self, now: float | None = None) -> int:
        """Run every deadline due at `now` (ms, the clock's time by default) that was set before
        this call; returns how many ran. Deadlines set while running wait for the next call, so
        a zero timeout cannot spin here."""
        if self._closed:
            return 0
        self._now_override = now
        try:
            at = self._now()
            before = self._timer.mark()
            ran = 0
            while (callback := self._timer.pop_due(at, before)) is not None:
                callback()
                ran += 1
            return ran
        finally:
            self._now_override = None

    def next_deadline(self) -> float | None:
        """When `expire()` next has something to do, on the clock; None if nothing is due ever."""
        return self._timer.next_deadline()

    async def run(self) -> None:
        """Fire deadlines as they come, until `close()`. The sleep is cut short when a request
        sets an earlier deadline."""
        while not self._closed:
            try:
                self.expire()
            except Exception:  # a bug in one deadline must not stop every other session's
                logger.exception("group coordinator: a deadline failed")
            deadline = self._timer.next_deadline()
            self._wake.clear()
            self._sleeping_until = deadline
            timeout = None if deadline is None else max(deadline - self._clock(), 0.0) / 1000
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            finally:
                self._sleeping_until = None

    def start(self) -> asyncio.Task:
        """Run `run()` as a task of the running loop (once); the task ends after `close()`."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self.run(), name="group-coordinator")
        return self._task

    def close(self, error: ErrorCode = ErrorCode.not_coordinator) -> None:
        """Fail every parked JoinGroup and SyncGroup with `error` (NOT_COORDINATOR by default,
        as Kafka's unload does: the client looks for the coordinator again), forget every group
        and stop the timer loop. Later calls answer COORDINATOR_NOT_AVAILABLE."""
        if self._closed:
            return
        self._closed = True
        now = self._now()
        for group in self._groups.values():
            for member in list(group.members.values()):
                group.complete_join(member, _join_error(member.member_id, error))
                group.complete_sync(member, SyncResult(error))
            group.transition_to(GroupState.DEAD, now)
        self._groups.clear()
        self._idle.clear()
        self._timer.clear()
        self._wake.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def _status(self, group_id: str, *, allow_empty: bool) -> ErrorCode | None:
        """GroupCoordinator.validateGroupStatus: a group id is required (the empty one is allowed
        for offsets, DescribeGroups and DeleteGroups only), and the coordinator must be open."""
        if not group_id and not allow_empty:
            return ErrorCode.invalid_group_id
        if self._closed:
            return ErrorCode.coordinator_not_available
        return None

    # -- JoinGroup

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        *,
        version: int,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int = -1,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        group_instance_id: str | None = None,
        reason: str | None = None,
    ) -> JoinResult:
        """JoinGroup, all versions: `version` is the request's (MEMBER_ID_REQUIRED from v4,
        skip_assignment from v9); `rebalance_timeout_ms` < 0 means the session timeout (v0 has
        no rebalance timeout); `group_instance_id` is None below v5. Waits until the member's
        part of the rebalance is decided."""
        request = _JoinRequest(
            group_id=group_id,
            member_id=member_id,
            group_instance_id=group_instance_id,
            version=version,
            client_id=client_id,
            client_host=client_host,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=(
                session_timeout_ms if rebalance_timeout_ms < 0 else rebalance_timeout_ms
            ),
            protocol_type=protocol_type,
            protocols=_dedup_protocols(protocols),
            reason=reason,
        )
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        self._join(request, waiter)
        return await waiter

    def _join(self, request: _JoinRequest, waiter: asyncio.Future) -> None:
        error = self._status(request.group_id, allow_empty=False)
        if error is None and not (
            self.min_session_timeout_ms <= request.session_timeout_ms <= self.max_session_timeout_ms
        ):
            error = ErrorCode.invalid_session_timeout
        if error is not None:
            _complete(waiter, _join_error(request.member_id, error))
            return
        is_unknown = request.member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(request.group_id)
        created = group is None
        if group is None:
            if not is_unknown:
                _complete(waiter, _join_error(request.member_id, ErrorCode.unknown_member_id))
                return
            group = self._groups[request.group_id] = _Group(request.group_id, self._now())
        if not self._accept_joining_member(group, request.member_id):
            self._drop(group, request.member_id)
            _complete(waiter, _join_error(UNKNOWN_MEMBER_ID, ErrorCode.group_max_size_reached))
            self._maybe_complete_join_phase(group)
        elif is_unknown:
            self._join_new_member(group, request, waiter)
        else:
            self._join_existing_member(group, request, waiter)
        if group.members or group.pending_join:
            self._idle.pop(group.group_id, None)
        elif created:
            del self._groups[request.group_id]  # a refused first join leaves nothing behind
        else:
            self._note_idle(group)

    def _accept_joining_member(self, group: _Group, member_id: str) -> bool:
        """GroupMetadataManager.acceptJoiningMember: existing members always, new ones up to
        group_max_size (counting members awaiting a join while a rebalance gathers them)."""
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            return (member is not None and member.join_waiter is not None) or (
                group.awaiting_join < self.group_max_size
            )
        return member is not None or len(group.members) < self.group_max_size

    def _join_new_member(
        self, group: _Group, request: _JoinRequest, waiter: asyncio.Future
    ) -> None:
        if group.state is GroupState.DEAD:
            _complete(waiter, _join_error(UNKNOWN_MEMBER_ID, ErrorCode.coordinator_not_available))
            return
        if not group.supports_protocols(request.protocol_type, (n for n, _ in request.protocols)):
            _complete(waiter, _join_error(UNKNOWN_MEMBER_ID, ErrorCode.inconsistent_group_protocol))
            return
        instance_id = request.group_instance_id
        prefix = request.client_id if instance_id is None else instance_id
        new_id = f"{prefix}-{uuid.uuid4()}"
        if request.group_instance_id is not None:
            old_id = group.static_members.get(request.group_instance_id)
            if old_id is not None:
                self._replace_static_member(group, request, old_id, new_id, waiter)
            else:
                self._add_member(group, request, new_id, waiter)
        elif request.version >= JOIN_REQUIRES_KNOWN_MEMBER_ID_VERSION:
            if len(group.pending_join) >= self.group_max_size:
                _complete(waiter, _join_error(UNKNOWN_MEMBER_ID, ErrorCode.group_max_size_reached))
                return
            # KIP-394: the member must come back with this id; until it does (within its session
            # timeout) it counts as a member the join phase waits for
            group.pending_join[new_id] = None
            self._schedule(
                _heartbeat_key(group.group_id, new_id), request.session_timeout_ms,
                functools.partial(self._expire_heartbeat, group.group_id, new_id),
            )
            _complete(waiter, _join_error(new_id, ErrorCode.member_id_required))
        else:
            self._add_member(group, request, new_id, waiter)

    def _join_existing_member(
        self, group: _Group, request: _JoinRequest, waiter: asyncio.Future
    ) -> None:
        member_id = request.member_id
        if group.state is GroupState.DEAD:
            _complete(waiter, _join_error(member_id, ErrorCode.coordinator_not_available))
            return
        if not group.supports_protocols(request.protocol_type, (n for n, _ in request.protocols)):
            _complete(waiter, _join_error(member_id, ErrorCode.inconsistent_group_protocol))
            return
        if member_id in group.pending_join and request.group_instance_id is None:
            self._add_member(group, request, member_id, waiter)
            return
        error = group.validate_member(member_id, request.group_instance_id)
        if error is not None:
            _complete(waiter, _join_error(member_id, error))
            return
        member = group.members[member_id]
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member(group, member, request, waiter, "joins during PreparingRebalance")
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(request.protocols):
                # the JoinGroup response was lost: answer it again, same generation
                _complete(waiter, group.join_result(member_id, members=group.is_leader(member_id)))
            else:
                self._update_member(group, member, request, waiter, "changed its metadata")
        elif state is GroupState.STABLE:
            if group.is_leader(member_id):
                # the leader may rejoin to rebalance on what the metadata does not show (a topic's
                # partition count): Kafka rebalances whenever it does
                self._update_member(group, member, request, waiter, "is the leader and rejoins")
            elif not member.matches(request.protocols):
                self._update_member(group, member, request, waiter, "changed its metadata")
            else:
                _complete(waiter, group.join_result(member_id, members=False))
        else:  # Empty: no members, so validate_member already refused; kept as Kafka has it
            _complete(waiter, _join_error(member_id, ErrorCode.unknown_member_id))

    def _add_member(
        self, group: _Group, request: _JoinRequest, member_id: str, waiter: asyncio.Future
    ) -> None:
        member = _Member(
            member_id, request.group_instance_id, request.client_id, request.client_host,
            request.rebalance_timeout_ms, request.session_timeout_ms, request.protocol_type,
            request.protocols,
        )
        member.is_new = True
        initial = group.previous_state is GroupState.EMPTY
        if group.state is GroupState.PREPARING_REBALANCE and initial:
            group.new_member_added = True  # the initial rebalance waits a little longer
        group.add(member, waiter)
        # a new member cannot heartbeat while its JoinGroup waits, and a client that gave up
        # retries with a new one: bound how long a new member's JoinGroup may wait
        self._reschedule_heartbeat(group, member, self.new_member_join_timeout_ms)
        logger.debug("group %s: member %s joins (%s)", group.group_id, member_id, request.reason)
        self._maybe_prepare_rebalance_or_complete_join(group, f"adding member {member_id}")

    def _update_member(
        self, group: _Group, member: _Member, request: _JoinRequest, waiter: asyncio.Future,
        why: str,
    ) -> None:
        group.update_member(
            member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms,
            waiter,
        )
        self._maybe_prepare_rebalance_or_complete_join(group, f"member {member.member_id} {why}")

    def _replace_static_member(
        self, group: _Group, request: _JoinRequest, old_id: str, new_id: str,
        waiter: asyncio.Future,
    ) -> None:
        """A known group instance id joins with no member id (the same instance restarted, or a
        second one with the same id): it takes the old member's place, the old id is fenced."""
        current_leader = group.leader_id
        self._timer.cancel(_heartbeat_key(group.group_id, old_id))
        member = group.replace_static_member(request.group_instance_id or "", old_id, new_id)
        self._reschedule_heartbeat(group, member)
        group.update_member(
            member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms,
            waiter,
        )
        logger.info(
            "group %s: static member %s rejoins as %s in %s; %s is fenced",
            group.group_id, request.group_instance_id, new_id, group.state.value, old_id,
        )
        if group.state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # the assignment stands: answer with the current generation, no rebalance
                if request.version >= JOIN_SUPPORTS_SKIP_ASSIGNMENT_VERSION:
                    leads = group.is_leader(new_id)
                    result = group.join_result(new_id, members=leads, skip_assignment=leads)
                else:
                    # the old leader id: a rejoined leader must not compute an assignment that a
                    # Stable group would not send to anyone
                    result = group.join_result(new_id, members=False, leader=current_leader)
                group.complete_join(member, result)
            else:
                self._maybe_prepare_rebalance_or_complete_join(
                    group, f"static member {new_id} changes the group's protocol"
                )
        elif group.state is GroupState.COMPLETING_REBALANCE:
            # the leader may have assigned to the old id already: assign again
            self._prepare_rebalance(group, f"static member {new_id} replaced {old_id}")
        else:
            self._maybe_complete_join_phase(group)

    # -- the rebalance

    def _maybe_prepare_rebalance_or_complete_join(self, group: _Group, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: _Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment(group, ErrorCode.rebalance_in_progress)
        group.pending_sync.clear()
        self._timer.cancel(_sync_key(group.group_id))
        initial = group.state is GroupState.EMPTY
        if initial:
            # a new group waits group.initial.rebalance.delay.ms for more members, longer while
            # they keep coming, up to the rebalance timeout
            delay = self.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule(
                _join_key(group.group_id), delay,
                functools.partial(self._initial_rebalance_step, group.group_id, delay, remaining),
            )
        group.transition_to(GroupState.PREPARING_REBALANCE, self._now())
        logger.info(
            "group %s: preparing to rebalance (generation %d): %s",
            group.group_id, group.generation_id, reason,
        )
        if not initial:
            if group.has_all_members_joined():
                self._complete_join(group)
            else:
                self._schedule(
                    _join_key(group.group_id), group.rebalance_timeout_ms(),
                    functools.partial(self._complete_join_of, group.group_id),
                )

    def _initial_rebalance_step(self, group_id: str, delay: int, remaining: int) -> None:
        group = self._groups.get(group_id)
        if group is None or group.state is not GroupState.PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            next_delay = min(self.initial_rebalance_delay_ms, remaining)
            next_remaining = max(remaining - delay, 0)
            self._schedule(
                _join_key(group_id), next_delay,
                functools.partial(
                    self._initial_rebalance_step, group_id, next_delay, next_remaining
                ),
            )
        else:
            self._complete_join(group)

    def _maybe_complete_join_phase(self, group: _Group) -> None:
        """Complete the join phase if every member has rejoined, except in a new group's first
        rebalance, which waits out its delay."""
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and group.previous_state is not GroupState.EMPTY
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _complete_join_of(self, group_id: str) -> None:
        group = self._groups.get(group_id)
        if group is not None and group.state is GroupState.PREPARING_REBALANCE:
            self._complete_join(group)

    def _complete_join(self, group: _Group) -> None:
        """The join phase ends: dynamic members that did not rejoin are removed, the generation
        moves on, every parked JoinGroup is answered (the leader with the members' metadata) and
        the group waits for SyncGroups, at most the rebalance timeout."""
        group_id = group.group_id
        self._timer.cancel(_join_key(group_id))
        for member in group.not_yet_rejoined():
            if not member.is_static:
                self._drop(group, member.member_id)
                logger.info("group %s: %s did not rejoin in time", group_id, member.member_id)
        if group.state is GroupState.DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # only static members that did not rejoin are left: wait again, until their
            # sessions expire or they come back
            self._schedule(
                _join_key(group_id), group.rebalance_timeout_ms(),
                functools.partial(self._complete_join_of, group_id),
            )
            return
        group.init_next_generation(self._now())
        if group.state is GroupState.EMPTY:
            logger.info("group %s: generation %d is empty", group_id, group.generation_id)
            self._note_idle(group)
            return
        logger.info(
            "group %s: generation %d with %d members, leader %s, protocol %s",
            group_id, group.generation_id, len(group.members), group.leader_id, group.protocol_name,
        )
        for member in group.members.values():
            leads = group.is_leader(member.member_id)
            group.complete_join(member, group.join_result(member.member_id, members=leads))
            self._reschedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync[member.member_id] = None
        self._schedule(
            _sync_key(group_id), group.rebalance_timeout_ms(),
            functools.partial(self._expire_pending_sync, group_id, group.generation_id),
        )

    def _expire_pending_sync(self, group_id: str, generation_id: int) -> None:
        """Members that got their JoinGroup answer but sent no SyncGroup within the rebalance
        timeout are removed, and the group rebalances without them."""
        group = self._groups.get(group_id)
        if group is None or group.generation_id != generation_id or not group.pending_sync:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        missing = list(group.pending_sync)
        for member_id in missing:
            self._drop(group, member_id)
        self._prepare_rebalance(group, f"no SyncGroup from {missing} within the rebalance timeout")

    def _note_idle(self, group: _Group) -> None:
        """An Empty group with no member id pending holds only its generation and protocol type
        (its offsets are the engine's): keep the `max_idle_groups` most recently idle, forget the
        rest (from then on the group is unknown here, as if deleted: DescribeGroups says Dead,
        and its first JoinGroup starts it again at generation 0)."""
        if group.state is not GroupState.EMPTY or group.members or group.pending_join:
            return
        self._idle[group.group_id] = None
        self._idle.move_to_end(group.group_id)
        while len(self._idle) > self.max_idle_groups:
            group_id, _ = self._idle.popitem(last=False)
            old = self._groups.pop(group_id)
            old.transition_to(GroupState.DEAD, self._now())
            logger.debug("group %s: forgotten after %d idle groups", group_id, len(self._idle))

    def _reset_and_propagate_assignment(self, group: _Group, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: _Group, error: ErrorCode) -> None:
        ok = error == ErrorCode.none
        for member in group.members.values():
            result = SyncResult(
                error, member.assignment,
                group.protocol_type if ok else None, group.protocol_name if ok else None,
            )
            if group.complete_sync(member, result):
                # a member parked in SyncGroup could not heartbeat: its session starts again now
                self._reschedule_heartbeat(group, member)

    # -- sessions

    def _reschedule_heartbeat(
        self, group: _Group, member: _Member, timeout_ms: int | None = None
    ) -> None:
        self._schedule(
            _heartbeat_key(group.group_id, member.member_id),
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            functools.partial(self._expire_heartbeat, group.group_id, member.member_id),
        )

    def _expire_heartbeat(self, group_id: str, member_id: str) -> None:
        group = self._groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return
        if member_id in group.pending_join:
            logger.info("group %s: pending member %s did not rejoin in time", group_id, member_id)
            group.remove(member_id)
            if group.state is GroupState.PREPARING_REBALANCE and group.has_all_members_joined():
                self._complete_join(group)
            self._note_idle(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return
        logger.info("group %s: member %s's session expired", group_id, member_id)
        self._remove_member_and_update(group, member_id, "session expired")

    def _drop(self, group: _Group, member_id: str) -> None:
        """Remove a member or a pending member id, answering whatever it has parked (UNKNOWN_
        MEMBER_ID: a client still there joins again) and forgetting its session."""
        member = group.members.get(member_id)
        if member is not None:
            group.complete_join(member, _join_error(UNKNOWN_MEMBER_ID, ErrorCode.unknown_member_id))
            group.complete_sync(member, SyncResult(ErrorCode.unknown_member_id))
        group.remove(member_id)
        self._timer.cancel(_heartbeat_key(group.group_id, member_id))

    def _remove_member_and_update(self, group: _Group, member_id: str, reason: str) -> None:
        self._drop(group, member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group, f"removing {member_id}: {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group)

    # -- SyncGroup

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: Sequence[tuple[str, bytes]] = (),
    ) -> SyncResult:
        """SyncGroup, all versions: the leader sends every member's assignment (members it leaves
        out get an empty one), followers send none. `protocol_type` / `protocol_name` (v5+, None
        below) must match the group's. A follower waits for the leader's assignment."""
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        self._sync(group_id, generation_id, member_id, group_instance_id, protocol_type,
                   protocol_name, assignments, waiter)
        return await waiter

    def _sync_error(
        self, group: _Group | None, generation_id: int, member_id: str, instance_id: str | None,
        protocol_type: str | None, protocol_name: str | None,
    ) -> ErrorCode | None:
        if group is None or group.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        error = group.validate_member(member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(
            protocol_name, group.protocol_name
        ):
            return ErrorCode.inconsistent_group_protocol
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return None

    def _sync(
        self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
        protocol_type: str | None, protocol_name: str | None,
        assignments: Sequence[tuple[str, bytes]], waiter: asyncio.Future,
    ) -> None:
        group = self._groups.get(group_id)
        error = self._status(group_id, allow_empty=False) or self._sync_error(
            group, generation_id, member_id, instance_id, protocol_type, protocol_name
        )
        if error is not None or group is None:
            _complete(waiter, SyncResult(error or ErrorCode.unknown_member_id))
            return
        member = group.members[member_id]
        if group.state is GroupState.STABLE:
            result = SyncResult(
                ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
            )
            _complete(waiter, result)
            self._synced(group, member_id)
            self._reschedule_heartbeat(group, member)
            return
        # CompletingRebalance: park until the leader's assignment
        if member.sync_waiter is not None:
            _complete(member.sync_waiter, SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_waiter = waiter
        self._synced(group, member_id)
        if group.is_leader(member_id):
            given = {mid: bytes(data) for mid, data in assignments}
            for other in group.members.values():
                other.assignment = given.get(other.member_id, b"")
            logger.info("group %s: assignment for generation %d received from the leader",
                        group_id, group.generation_id)
            self._propagate_assignment(group, ErrorCode.none)
            group.transition_to(GroupState.STABLE, self._now())

    def _synced(self, group: _Group, member_id: str) -> None:
        group.pending_sync.pop(member_id, None)
        if not group.pending_sync:
            self._timer.cancel(_sync_key(group.group_id))

    # -- Heartbeat

    async def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> ErrorCode:
        """Heartbeat, all versions: extends the member's session. REBALANCE_IN_PROGRESS while the
        group gathers members (the member must rejoin); NONE while it waits for the leader's
        assignment and when Stable."""
        error = self._status(group_id, allow_empty=False)
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        self._reschedule_heartbeat(group, group.members[member_id])
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # -- LeaveGroup

    async def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]], reason: str | None = None
    ) -> LeaveResult:
        """LeaveGroup: `members` is (member_id, group_instance_id) pairs; below v3 one pair with
        no instance id. A static member may be removed by its instance id alone (member id "",
        as the admin client does)."""
        error = self._status(group_id, allow_empty=False)
        if error is not None:
            return LeaveResult(error)
        group = self._groups.get(group_id)
        if group is None:
            return LeaveResult(ErrorCode.unknown_member_id)
        if group.state is GroupState.DEAD:
            return LeaveResult(ErrorCode.coordinator_not_available)
        results = []
        left = []
        for member_id, instance_id in members:
            if member_id == UNKNOWN_MEMBER_ID:
                holder = group.static_members.get(instance_id) if instance_id is not None else None
                error = ErrorCode.unknown_member_id if holder is None else None
                target = holder
            elif member_id in group.pending_join:
                error, target = None, member_id
            else:
                error, target = group.validate_member(member_id, instance_id), member_id
            if error is None and target is not None:
                self._drop(group, target)
                left.append(target)
            results.append(LeaveMemberResult(member_id, instance_id, error or ErrorCode.none))
        if left:
            logger.info("group %s: %s left (%s)", group_id, left, reason or "no reason given")
            if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance_or_complete_join(group, f"{left} left the group")
            else:
                self._maybe_complete_join_phase(group)
            self._note_idle(group)
        return LeaveResult(ErrorCode.none, tuple(results))

    # -- DescribeGroups, ListGroups, DeleteGroups

    async def describe_groups(self, group_ids: Sequence[str]) -> list[GroupDescription]:
        out = []
        for group_id in group_ids:
            error = self._status(group_id, allow_empty=True)
            group = self._groups.get(group_id)
            if error is not None:
                out.append(GroupDescription(group_id, error, "", "", ""))
            elif group is None:
                dead = GroupState.DEAD.value
                out.append(GroupDescription(group_id, ErrorCode.none, dead, "", ""))
            else:
                out.append(group.describe())
        return out

    async def list_groups(
        self, states_filter: Iterable[str] = (), types_filter: Iterable[str] = ()
    ) -> ListGroupsResult:
        """ListGroups: `states_filter` (v4+) and `types_filter` (v5+) match case-insensitively;
        empty filters match every group. Every group here is a classic one."""
        if self._closed:
            return ListGroupsResult(ErrorCode.coordinator_not_available)
        states = {s.lower() for s in states_filter}
        types = {t.lower() for t in types_filter}
        if types and CLASSIC not in types:
            return ListGroupsResult(ErrorCode.none)
        return ListGroupsResult(
            ErrorCode.none,
            tuple(
                GroupListing(g.group_id, g.protocol_type or "", g.state.value)
                for g in self._groups.values()
                if not states or g.state.value.lower() in states
            ),
        )

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: an Empty group is deleted (NONE), a group with members is not
        (NON_EMPTY_GROUP), an unknown one answers GROUP_ID_NOT_FOUND. The caller deletes the
        deleted groups' committed offsets."""
        out: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            error = self._status(group_id, allow_empty=True)
            group = self._groups.get(group_id)
            if error is not None:
                out[group_id] = error
            elif group is None or group.state is GroupState.DEAD:
                out[group_id] = ErrorCode.group_id_not_found
            elif group.state is not GroupState.EMPTY:
                out[group_id] = ErrorCode.non_empty_group
            else:
                for member_id in list(group.pending_join):
                    self._drop(group, member_id)
                self._timer.cancel(_join_key(group_id))
                self._timer.cancel(_sync_key(group_id))
                group.transition_to(GroupState.DEAD, self._now())
                del self._groups[group_id]
                self._idle.pop(group_id, None)
                out[group_id] = ErrorCode.none
        return out

    # -- OffsetCommit

    def validate_commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
        *,
        api_version: int | None = None,
        transactional: bool = False,
    ) -> ErrorCode:
        """Whether an OffsetCommit (or, with `transactional`, a TxnOffsetCommit) may commit for
        this group: ClassicGroup.validateOffsetCommit. Generation -1 is a commit from outside
        group management (the admin client, a consumer with assign()): allowed while the group is
        Empty or unknown. Otherwise the member and generation must be current, and not while
        the group waits for its assignment (REBALANCE_IN_PROGRESS). For a group unknown here
        with a generation, OffsetCommit v9+ (`api_version`) answers GROUP_ID_NOT_FOUND, older
        versions ILLEGAL_GENERATION. A valid commit extends the member's session, as Kafka's
        GroupCoordinator.doCommitOffsets did: a member that commits is alive. Answers at once."""
        error = self._status(group_id, allow_empty=True)
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if group is None:
            if generation_id < 0:
                return ErrorCode.none
            if api_version is not None and api_version >= OFFSET_COMMIT_GROUP_ID_NOT_FOUND_VERSION:
                return ErrorCode.group_id_not_found
            return ErrorCode.illegal_generation
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.none
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
        elif not transactional and group.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id  # a simple commit while the group has members
        if not transactional and group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        member = group.members.get(member_id)
        alive = (GroupState.STABLE, GroupState.PREPARING_REBALANCE)
        if member is not None and group.state in alive:
            self._reschedule_heartbeat(group, member)
        return ErrorCode.none


def _inconsistent(given: str | None, group_has: str | None) -> bool:
    return given is not None and group_has is not None and given != group_has
