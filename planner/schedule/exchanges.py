"""A runtime's blocking exchange calls, lowered among a pipeline order's compute actions.

A runtime that blocks on pipeline sends and receives makes its own calls between compute
actions (`ExchangeProgram`: planner/runtimes holds the runtimes' programs; the simulator takes
one as an input and names none). An NCCL send or receive completes only when both peers have
posted, so each call ends at the latest post among itself and the calls it pairs with, plus
one hold, the transfer: `place_exchanges` pairs them (each action's output is sent in the
first call after it, received in the last call before its consumer) and orders actions and
calls topologically, for the simulator's rendezvous pass.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from planner.errors import ScheduleError
from planner.schedule.actions import Action
from planner.schedule.validate import OrderInfo


class ExchangeProgram(Protocol):
    """Where a runtime makes its blocking send/receive calls among a rank's compute actions.
    Hashable and immutable: compiled schedules are cached on it."""

    name: str
    """Names the program in errors."""

    def call_gaps(self, rank: int, actions: Sequence[Action], info: OrderInfo) -> Sequence[int]:
        """Per gap of rank `rank`'s action list (gap 0 before its first action, gap i between
        actions i-1 and i, the last after its last), how many calls the runtime makes there
        in order: 0 none, 1 a combined send + receive call, 2 a send call then a receive call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Exchanges:
    """Each rank's actions and blocking exchange calls as nodes in one topological order.

    Node i is action position `action[i]` (>= 0) or an exchange call (-1) of rank `rank[i]`.
    A call starts when its rank reaches it and every peer call it pairs with has been posted:
    `waits[i]` are the nodes that precede those peer calls on their ranks (their ends are the
    peers' post times); it then holds its rank for the transfer: `direction[i]` 1 forward
    ops only, 2 backward only, 3 both. `after_start[i]` is 0 for calls before the rank's
    first action (waiting for its first input is pipeline fill, not a blocked exchange)."""

    rank: array
    action: array
    waits: tuple[tuple[int, ...], ...]
    direction: array
    after_start: array
    last_node: array
    """Per action position, the last node before the rank's next action (the action itself
    or its trailing calls): the action's reported end includes those calls, like a hold."""


def place_exchanges(
    program: ExchangeProgram,
    order: Mapping[int, Sequence[Action]],
    info: OrderInfo,
    offset: list[int],
    forward: list[bool],
    dep: list[int],
    remote: bytearray,
    position: list[int],
) -> Exchanges:
    """Place `program`'s exchange calls among each rank's actions, pair each send with its
    receive, and order actions and calls topologically (see `Exchanges`); ScheduleError if the
    blocking calls deadlock. An action's output is sent in the first call after it, its input
    received in the last call before it; calls that carry nothing are left out.

    The actions are `order`'s, flattened rank by rank (rank r's at offset[r]:offset[r+1]);
    per flat index, `forward` says whether it is a forward, `dep` is its cross-stage input's
    index (-1: none), `remote` whether that input comes from another rank, and `position` is
    its place in the compiled topological order."""
    num_ranks = len(offset) - 1
    # per rank: items in program order, each an action index g (>= 0) or -(call id) - 1
    items: list[list[int]] = []
    send_call: dict[int, int] = {}
    recv_call: dict[int, int] = {}
    call_dir: list[int] = []
    call_ops: list[list[int]] = []  # per call, the peer calls its messages pair it with
    for r in range(num_ranks):
        acts = list(range(offset[r], offset[r + 1]))
        gaps = program.call_gaps(r, order[r], info)
        slots: list[list[int]] = []  # per gap, its calls' ids in program order
        for count in gaps:
            slots.append(list(range(len(call_ops), len(call_ops) + count)))
            call_dir += [0] * count
            call_ops += [[] for _ in range(count)]
        for i, g in enumerate(acts):
            if remote[g]:  # received in the last call before it
                for k in range(i, -1, -1):
                    if slots[k]:
                        recv_call[g] = slots[k][-1]
                        break
            # its send, if any, goes to the first call after it
            for k in range(i + 1, len(slots)):
                if slots[k]:
                    send_call[g] = slots[k][0]
                    break
        row: list[int] = []
        for i, ids in enumerate(slots):
            row += [-c - 1 for c in ids]
            if i < len(acts):
                row.append(acts[i])
        items.append(row)
    for g, d in enumerate(dep):
        if d >= 0 and remote[g]:
            s, c = send_call[d], recv_call[g]
            way = 1 if forward[d] else 2
            call_dir[s] |= way
            call_dir[c] |= way
            call_ops[s].append(c)
            call_ops[c].append(s)
    # nodes: actions and the calls that carry something, numbered rank by rank
    node_of_call: dict[int, int] = {}
    node_rank, node_action, node_call = [], [], []
    for r, row in enumerate(items):
        for x in row:
            if x < 0 and not call_ops[-x - 1]:
                continue
            if x < 0:
                node_of_call[-x - 1] = len(node_rank)
            node_rank.append(r)
            node_action.append(x)
            node_call.append(-x - 1 if x < 0 else -1)
    count = len(node_rank)
    prev = [-1] * count
    for i in range(1, count):
        if node_rank[i] == node_rank[i - 1]:
            prev[i] = i - 1
    waits: list[tuple[int, ...]] = []
    for i in range(count):
        c = node_call[i]
        peers = {prev[node_of_call[q]] for q in call_ops[c]} if c >= 0 else set()
        peers.discard(-1)
        waits.append(tuple(sorted(peers)))
    # topological order (Kahn) over same-rank order and peer posts
    needs = [len(w) + (prev[i] >= 0) for i, w in enumerate(waits)]
    users: list[list[int]] = [[] for _ in range(count)]
    for i in range(count):
        for q in waits[i]:
            users[q].append(i)
        if prev[i] >= 0:
            users[prev[i]].append(i)
    ready = [i for i in range(count) if needs[i] == 0]
    topo: list[int] = []
    while ready:
        i = ready.pop()
        topo.append(i)
        for u in users[i]:
            needs[u] -= 1
            if needs[u] == 0:
                ready.append(u)
    if len(topo) < count:
        raise ScheduleError(
            f"the {program.name} exchange calls deadlock on this order; it cannot run with blocking sends and receives"
        )
    index = [0] * count
    for k, i in enumerate(topo):
        index[i] = k
    started = [False] * num_ranks
    after_start = bytearray(count)
    for i in range(count):
        if node_action[i] >= 0:
            started[node_rank[i]] = True
        else:
            after_start[i] = started[node_rank[i]]
    last_node = [0] * len(dep)
    for i in range(count):
        g = node_action[i]
        if g >= 0:
            j = i
            while j + 1 < count and node_rank[j + 1] == node_rank[i] and node_action[j + 1] < 0:
                j += 1
            last_node[position[g]] = index[j]
    return Exchanges(
        rank=array("i", [node_rank[i] for i in topo]),
        action=array("i", [position[node_action[i]] if node_action[i] >= 0 else -1 for i in topo]),
        waits=tuple(tuple(index[q] for q in waits[i]) for i in topo),
        direction=array("b", [call_dir[node_call[i]] if node_call[i] >= 0 else 0 for i in topo]),
        after_start=array("b", [after_start[i] for i in topo]),
        last_node=array("i", last_node),
    )
