"""The classic Kafka group coordinator: membership and generations; clients assign.

The group leader (a client) computes the assignment from the members' subscriptions; the
coordinator only counts generations, holds JoinGroup and SyncGroup answers until the
rebalance is complete, and forwards opaque bytes. Life cycle of a group::

        first join                all members joined (or rebalance timeout)
    EMPTY ---------> PREPARING_REBALANCE ----------------> COMPLETING_REBALANCE
      ^                 ^     ^                                   |
      |   last member   |     | a member joins, leaves or         | leader's SyncGroup
      +---- leaves -----+     | its session expires               v
                              +------------------------------- STABLE

While PREPARING_REBALANCE, Heartbeat and SyncGroup of members answer REBALANCE_IN_PROGRESS
(27), which makes them send JoinGroup again; an OffsetCommit of the current generation is still
accepted then (members commit what they read before rejoining), and answered 27 only while
COMPLETING_REBALANCE. A join from a new member
(or from any member of a STABLE group) starts a rebalance. A member that sends nothing for its
session timeout is removed (members waiting in JoinGroup do not expire); a rebalance drops the
members that did not rejoin within the largest rebalance timeout.

State lives in memory: after a restart members get UNKNOWN_MEMBER_ID and rejoin, as after a
coordinator move in Kafka. Committed offsets are not kept here but in LogHub's checkpoints,
so a group with no members is forgotten at the next tick, as after a restart; a member id
handed out with MEMBER_ID_REQUIRED lapses after the session timeout asked for, as in Kafka,
and members and such ids together are at most ``members_per_group_max``.

Not thread-safe: used from the listener's event loop only.
"""

from __future__ import annotations

import asyncio
import enum
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from loghub._clock import Clock

__all__ = ["Coordinator", "GroupState", "subscribed_topics"]

NONE = 0
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79

session_timeout_ms_min = 1_000
session_timeout_ms_max = 1_800_000
members_per_group_max = 1000


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


_VALID_PREVIOUS: dict[GroupState, set[GroupState]] = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {
        GroupState.EMPTY,
        GroupState.COMPLETING_REBALANCE,
        GroupState.STABLE,
    },
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
}


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_seen_ms: int
    join_waiter: asyncio.Future[dict[str, Any]] | None = None
    sync_waiter: asyncio.Future[dict[str, Any]] | None = None
    assignment: bytes = b""


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # member ids handed out with MEMBER_ID_REQUIRED -> when they lapse (monotonic ms)
    pending_ids: dict[str, int] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    initial_delay_until_ms: int = 0
    formed_wall_ms: int = 0  # when this coordinator first saw the group (wall clock)

    def transition_to(self, state: GroupState) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise AssertionError(f"group {self.group_id}: {self.state} -> {state}")
        self.state = state


class Coordinator:
    def __init__(self, clock: Clock, initial_rebalance_delay_ms: int) -> None:
        self._clock = clock
        self._initial_delay_ms = initial_rebalance_delay_ms
        self.groups: dict[str, Group] = {}
        self._wakeup: asyncio.Event | None = None

    # -- requests ------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        client_host: str,
        instance_id: str | None,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> dict[str, Any]:
        """The JoinGroup answer: ErrorCode, GenerationId, ProtocolName, Leader, MemberId,
        Members (for the leader only)."""
        if not session_timeout_ms_min <= session_timeout_ms <= session_timeout_ms_max:
            return _join_error(INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, formed_wall_ms=self._clock.wall_ms())
        if group.members and group.protocol_type not in (None, protocol_type):
            return _join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        names = {name for name, _ in protocols}
        if group.members and not all(
            names & {n for n, _ in m.protocols} for m in group.members.values()
        ):
            return _join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                if len(group.members) + len(group.pending_ids) >= members_per_group_max:
                    return _join_error(INCONSISTENT_GROUP_PROTOCOL, "")
                lapse_ms = self._clock.monotonic_ms() + session_timeout_ms
                group.pending_ids[member_id] = lapse_ms
                return _join_error(MEMBER_ID_REQUIRED, member_id)
        elif member_id not in group.members and member_id not in group.pending_ids:
            return _join_error(UNKNOWN_MEMBER_ID, member_id)
        if member_id not in group.members and len(group.members) >= members_per_group_max:
            return _join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        group.pending_ids.pop(member_id, None)
        now_ms = self._clock.monotonic_ms()
        member = group.members.get(member_id)
        if member is None:
            member = Member(
                member_id,
                client_id,
                client_host,
                instance_id,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
                now_ms,
            )
            group.members[member_id] = member
        else:
            member.protocols = protocols
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            member.last_seen_ms = now_ms
        group.protocol_type = protocol_type
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.set_result(_join_error(UNKNOWN_MEMBER_ID, member_id))
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        member.join_waiter = waiter
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group)
        self._try_complete_join(group)
        return await waiter

    async def sync(
        self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes]
    ) -> tuple[int, bytes, str | None, str | None]:
        """(error, this member's assignment, protocol type, protocol name)."""
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, generation)
        if error or group is None:
            return error or UNKNOWN_MEMBER_ID, b"", None, None
        member = group.members[member_id]
        member.last_seen_ms = self._clock.monotonic_ms()
        if group.state is GroupState.STABLE:
            return NONE, member.assignment, group.protocol_type, group.protocol
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        member.sync_waiter = waiter
        if member_id == group.leader:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            group.transition_to(GroupState.STABLE)
            for each in group.members.values():
                if each.sync_waiter is not None and not each.sync_waiter.done():
                    each.sync_waiter.set_result({"error": NONE, "assignment": each.assignment})
                each.sync_waiter = None
        answer = await waiter
        return answer["error"], answer["assignment"], group.protocol_type, group.protocol

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, generation)
        if error or group is None:
            return error or UNKNOWN_MEMBER_ID
        group.members[member_id].last_seen_ms = self._clock.monotonic_ms()
        if group.state is GroupState.COMPLETING_REBALANCE:
            return NONE
        return NONE

    def leave(self, group_id: str, member_ids: list[str]) -> list[int]:
        group = self.groups.get(group_id)
        errors = []
        for member_id in member_ids:
            if group is None or member_id not in group.members:
                errors.append(UNKNOWN_MEMBER_ID)
                continue
            self._remove(group, member_id)
            errors.append(NONE)
        if group is not None and any(e == NONE for e in errors):
            self._after_removal(group)
        return errors

    def check_commit(self, group_id: str, generation: int, member_id: str) -> int:
        """Whether an OffsetCommit may be stored. A commit with generation -1 and no member
        id comes from a consumer outside the group protocol (``assign``): accepted."""
        if generation < 0 and not member_id:
            return NONE
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        group.members[member_id].last_seen_ms = self._clock.monotonic_ms()
        if generation != group.generation:
            return ILLEGAL_GENERATION
        # A member commits what it read before it rejoins (PREPARING_REBALANCE: accepted, as
        # Kafka does); between the join and the assignment its partitions are not its own.
        if group.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    # -- time ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Expires sessions and ends rebalances whose time is up; call every few 100 ms."""
        now_ms = self._clock.monotonic_ms()
        for group in list(self.groups.values()):
            expired = [
                m.member_id
                for m in group.members.values()
                if (m.join_waiter is None or m.join_waiter.done())
                and now_ms - m.last_seen_ms > m.session_timeout_ms
            ]
            for member_id in expired:
                self._remove(group, member_id)
            if expired:
                self._after_removal(group)
            if group.state is GroupState.PREPARING_REBALANCE:
                if now_ms >= group.rebalance_deadline_ms:
                    for member in list(group.members.values()):
                        if member.join_waiter is None or member.join_waiter.done():
                            self._remove(group, member.member_id)
                self._try_complete_join(group)
            for member_id, lapse_ms in list(group.pending_ids.items()):
                if now_ms > lapse_ms:  # handed out, never used: as Kafka, for a session
                    del group.pending_ids[member_id]
            if group.state is GroupState.EMPTY and not group.members and not group.pending_ids:
                # forgotten, as after a restart: its offsets are LogHub checkpoints, and a
                # client that makes up a group id per run must not grow the server
                del self.groups[group.group_id]

    # -- internals -----------------------------------------------------------------------

    def _check_member(self, group: Group | None, member_id: str, generation: int) -> int:
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        group.members[member_id].last_seen_ms = self._clock.monotonic_ms()
        if group.state is GroupState.PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return ILLEGAL_GENERATION
        return NONE

    def _prepare_rebalance(self, group: Group) -> None:
        now_ms = self._clock.monotonic_ms()
        if group.state is GroupState.EMPTY:
            group.initial_delay_until_ms = now_ms + self._initial_delay_ms
        for member in group.members.values():
            if member.sync_waiter is not None and not member.sync_waiter.done():
                member.sync_waiter.set_result({"error": REBALANCE_IN_PROGRESS, "assignment": b""})
            member.sync_waiter = None
        group.transition_to(GroupState.PREPARING_REBALANCE)
        timeout_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_ms = now_ms + timeout_ms

    def _try_complete_join(self, group: Group) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if not group.members:
            group.transition_to(GroupState.EMPTY)
            return
        waiting = [m for m in group.members.values() if m.join_waiter and not m.join_waiter.done()]
        if len(waiting) < len(group.members):
            return
        if self._clock.monotonic_ms() < group.initial_delay_until_ms:
            return
        self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        members = list(group.members.values())
        if group.leader not in group.members:
            group.leader = members[0].member_id
        leader = group.members[group.leader]
        common = set.intersection(*({name for name, _ in m.protocols} for m in members))
        group.protocol = next(name for name, _ in leader.protocols if name in common)
        group.generation += 1
        group.transition_to(GroupState.COMPLETING_REBALANCE)
        member_list = [
            {
                "MemberId": m.member_id,
                "GroupInstanceId": m.instance_id,
                "Metadata": dict(m.protocols)[group.protocol],
            }
            for m in members
        ]
        for member in members:
            assert member.join_waiter is not None
            member.join_waiter.set_result(
                {
                    "ErrorCode": NONE,
                    "GenerationId": group.generation,
                    "ProtocolType": group.protocol_type,
                    "ProtocolName": group.protocol,
                    "Leader": group.leader,
                    "MemberId": member.member_id,
                    "Members": member_list if member.member_id == group.leader else [],
                }
            )
            member.join_waiter = None

    def _remove(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        for waiter in (member.join_waiter, member.sync_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(
                    _join_error(UNKNOWN_MEMBER_ID, member_id)
                    | {"error": UNKNOWN_MEMBER_ID, "assignment": b""}
                )
        if group.leader == member_id:
            group.leader = None

    def _after_removal(self, group: Group) -> None:
        if group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)
        elif group.state is not GroupState.EMPTY:
            self._prepare_rebalance(group)
            self._try_complete_join(group)

    def describe(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def force_rebalance(self, group_id: str) -> None:
        """Makes a settled group rebalance (its members learn it from their next heartbeat),
        so that a leader assigns partitions that have appeared since."""
        group = self.groups.get(group_id)
        if group is not None and group.state in (
            GroupState.STABLE,
            GroupState.COMPLETING_REBALANCE,
        ):
            self._prepare_rebalance(group)
            self._try_complete_join(group)


def subscribed_topics(group: Group) -> set[str]:
    """The topics the members of a "consumer" group subscribe to, read from the
    ConsumerProtocolSubscription each sent (int16 version, then an array of int16-length
    strings, in every version); metadata that does not parse is skipped."""
    topics: set[str] = set()
    if group.protocol_type != "consumer":
        return topics
    for member in group.members.values():
        for _name, metadata in member.protocols[:1]:
            try:
                (count,) = struct.unpack_from(">i", metadata, 2)
                pos = 6
                for _ in range(max(0, min(count, 10_000))):
                    (size,) = struct.unpack_from(">h", metadata, pos)
                    topics.add(metadata[pos + 2 : pos + 2 + size].decode())
                    pos += 2 + size
            except (struct.error, UnicodeDecodeError):
                continue
    return topics


def _join_error(error: int, member_id: str) -> dict[str, Any]:
    return {
        "ErrorCode": error,
        "GenerationId": -1,
        "ProtocolName": None,
        "Leader": "",
        "MemberId": member_id,
        "Members": [],
    }
