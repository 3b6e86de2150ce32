"""The sends and receives a compute order implies, in torch's SEND_F/RECV_F/SEND_B/RECV_B terms.

A forward F(s, m) whose next stage s+1 lives on another rank implies SEND_F(s, m) on its
rank and RECV_F(s+1, m) on the other; a backward B or I of stage s whose previous stage s-1
lives elsewhere implies SEND_B(s, m) and RECV_B(s-1, m). Stages on the same rank (the turn of
a V placement) exchange nothing. `add_send_recv` posts each send right after its producer
(asynchronous, like torch's isend) and each receive right before its consumer (torch's
`defer_pp_recv` placement); since the compute order is deadlock-free, so is the lowering.
"""

from __future__ import annotations

from planner.errors import ScheduleError
from planner.schedule.actions import (
    COMPUTE_TYPES,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    Action,
    B,
    F,
    I,
    PipelineOrder,
    W,
)
from planner.schedule.validate import OrderInfo, check_order


def _direction(kind: str) -> str:
    return "F" if kind == F else "BI"


def _transfer(action: Action, info: OrderInfo) -> tuple[Action, Action, tuple[int, str, int]] | None:
    """(send, receive, consumer key) of the transfer compute `action` starts, if its output
    goes to another rank; the consumer key is (stage, "F" or "BI", micro-batch)."""
    stage, kind, mb = action
    if kind == F and stage + 1 < info.num_stages:
        peer, send, recv = stage + 1, SEND_F, RECV_F
    elif kind in (B, I) and stage > 0:
        peer, send, recv = stage - 1, SEND_B, RECV_B
    else:
        return None
    if info.stage_rank[peer] == info.stage_rank[stage]:
        return None
    return Action(stage, send, mb), Action(peer, recv, mb), (peer, _direction(kind), mb)


def compute_only(order: PipelineOrder) -> PipelineOrder:
    """The order without sends and receives."""
    return {r: [a for a in acts if a.computation_type in COMPUTE_TYPES] for r, acts in order.items()}


def add_send_recv(order: PipelineOrder) -> PipelineOrder:
    """Lower a compute-only order: each send after its producer, each receive before its consumer."""
    info = check_order(order)
    receive_for = {}
    for acts in order.values():
        for a in acts:
            transfer = _transfer(a, info)
            if transfer is not None:
                receive_for[transfer[2]] = transfer[1]
    lowered: PipelineOrder = {}
    for r, acts in order.items():
        out: list[Action] = []
        for a in acts:
            recv = receive_for.get((a.stage_index, _direction(a.computation_type), a.microbatch_index))
            if recv is not None and a.computation_type != W:
                out.append(recv)
            out.append(a)
            transfer = _transfer(a, info)
            if transfer is not None:
                out.append(transfer[0])
        lowered[r] = out
    return lowered


def check_send_recv(order: PipelineOrder) -> None:
    """Check a lowered order: each cross-rank transfer has exactly one send on the producer's
    rank after the producer and one receive on the consumer's rank before the consumer."""
    compute = compute_only(order)
    info = check_order(compute)
    position = {a: (r, i) for r, acts in order.items() for i, a in enumerate(acts)}
    consumer = {
        (a.stage_index, _direction(a.computation_type), a.microbatch_index): a
        for acts in compute.values()
        for a in acts
        if a.computation_type != W
    }
    comm_count = sum(1 for acts in order.values() for a in acts if a.computation_type not in COMPUTE_TYPES)
    expected = 0
    for acts in compute.values():
        for a in acts:
            transfer = _transfer(a, info)
            if transfer is None:
                continue
            send, recv, key = transfer
            expected += 2
            for comm, anchor, after in ((send, a, True), (recv, consumer[key], False)):
                if comm not in position:
                    raise ScheduleError(f"{anchor} needs {comm}, which is missing: add it")
                (rank, at), (anchor_rank, anchor_at) = position[comm], position[anchor]
                if rank != anchor_rank or (at < anchor_at if after else at > anchor_at):
                    where = "after" if after else "before"
                    raise ScheduleError(f"{comm} must be on rank {anchor_rank} {where} {anchor}")
    if comm_count != expected:
        raise ScheduleError(
            f"the order has {comm_count} sends/receives but its compute implies {expected}: remove the extra ones"
        )
