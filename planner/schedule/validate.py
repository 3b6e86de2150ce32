"""Structural invariants of a compute-only pipeline order.

`check_order` is what every consumer runs first: ranks 0..P-1, each stage on one rank, the
same number of stages (chunks) on every rank, micro-batches 0..M-1, and for every
(stage, micro-batch) exactly one F and either one full backward B or one I and one W, in the
rank order F < I < W (F < B). Timing-dependent validity (deadlock) is the simulator's check.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ScheduleError
from planner.schedule.actions import Action, B, F, I, PipelineOrder, W


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderInfo:
    """Shape of a valid order, inferred from its actions."""

    num_ranks: int
    num_stages: int
    num_microbatches: int
    vpp: int
    stage_rank: tuple[int, ...]
    """stage -> rank holding it."""
    stage_chunk: tuple[int, ...]
    """stage -> its chunk index on that rank (the c-th smallest stage id of the rank)."""


def _where(order: PipelineOrder, action: Action) -> str:
    places = [f"rank {r} position {i}" for r in sorted(order) for i, a in enumerate(order[r]) if a == action]
    return ", ".join(places)


_KIND = {F: 0, I: 1, W: 2, B: 3}


def _scan(order: PipelineOrder, ranks: list[int]) -> tuple[dict[int, int], int]:
    """stage -> rank and the largest micro-batch index; rejects malformed actions."""
    stage_rank: dict[int, int] = {}
    max_mb = -1
    for r in ranks:
        for pos, a in enumerate(order[r]):
            stage, kind, mb = a
            if kind not in _KIND:
                raise ScheduleError(
                    f"rank {r} position {pos}: {a} is not a compute action; simulate the compute-only "
                    "order (comms.compute_only strips sends and receives)"
                )
            if mb is None or mb < 0 or stage < 0:
                raise ScheduleError(f"rank {r} position {pos}: {a} needs a stage and a micro-batch >= 0")
            if stage_rank.setdefault(stage, r) != r:
                raise ScheduleError(
                    f"stage {stage} appears on rank {stage_rank[stage]} and rank {r}: a stage lives on one rank"
                )
            if mb > max_mb:
                max_mb = mb
    return stage_rank, max_mb


def check_order(order: PipelineOrder) -> OrderInfo:
    """Check the invariants above; return the inferred shape. ScheduleError names the culprit."""
    return index_order(order)[0]


def index_order(order: PipelineOrder) -> tuple[OrderInfo, list[list[int]]]:
    """`check_order`, plus where each action sits: tables[k][stage * M + mb] is the index of
    the (stage, mb) action of kind k (F 0, I 1, W 2, B 3) in the rank-major concatenation of
    the ranks' lists, -1 if absent (the simulator's dependency lookup)."""
    ranks = sorted(order)
    if not ranks or ranks != list(range(len(ranks))):
        raise ScheduleError(f"a schedule needs ranks numbered 0..P-1, got {ranks}")
    stage_rank, max_mb = _scan(order, ranks)
    if not stage_rank:
        raise ScheduleError("the schedule has no actions")
    num_stages = max(stage_rank) + 1
    missing_stages = sorted(set(range(num_stages)) - set(stage_rank))
    if missing_stages:
        raise ScheduleError(f"stages {missing_stages} have no actions; stages must be numbered 0..{num_stages - 1}")
    per_rank = [sorted(s for s, rr in stage_rank.items() if rr == r) for r in ranks]
    if len({len(stages) for stages in per_rank}) != 1:
        counts = {r: len(stages) for r, stages in zip(ranks, per_rank)}
        raise ScheduleError(f"every rank must hold the same number of stages (chunks), got {counts}")
    num_mb = max_mb + 1
    tables = [[-1] * (num_stages * num_mb) for _ in range(4)]
    g = 0
    for r in ranks:
        for a in order[r]:
            stage, kind, mb = a
            table, key = tables[_KIND[kind]], stage * num_mb + mb
            if table[key] >= 0:
                raise ScheduleError(f"action {a} is listed twice ({_where(order, a)}); keep one")
            table[key] = g
            g += 1
    fwd, inp, wgt, full = tables
    for key in range(num_stages * num_mb):
        f_at, i_at, w_at, b_at = fwd[key], inp[key], wgt[key], full[key]
        if f_at >= 0 and ((b_at > f_at and i_at < 0 and w_at < 0) or (b_at < 0 and f_at < i_at < w_at)):
            continue
        _explain(order, stage_rank, key // num_mb, key % num_mb, f_at, i_at, w_at, b_at)
    stage_chunk = [0] * num_stages
    for stages in per_rank:
        for chunk, stage in enumerate(stages):
            stage_chunk[stage] = chunk
    info = OrderInfo(
        num_ranks=len(ranks),
        num_stages=num_stages,
        num_microbatches=num_mb,
        vpp=len(per_rank[0]),
        stage_rank=tuple(stage_rank[s] for s in range(num_stages)),
        stage_chunk=tuple(stage_chunk),
    )
    return info, tables


def _explain(
    order: PipelineOrder,
    stage_rank: dict[int, int],
    stage: int,
    mb: int,
    f_pos: int,
    i_pos: int,
    w_pos: int,
    b_pos: int,
) -> None:
    """Raise the ScheduleError that says what is wrong with (stage, mb)'s actions."""
    r = stage_rank[stage]
    if f_pos < 0:
        raise ScheduleError(f"rank {r} never runs {Action(stage, F, mb)}: add it (each micro-batch once per stage)")
    if b_pos >= 0 and (i_pos >= 0 or w_pos >= 0):
        raise ScheduleError(
            f"stage {stage} micro-batch {mb} has both a full backward B and a split I/W backward; keep one"
        )
    if b_pos < 0 and (i_pos < 0 or w_pos < 0):
        kind = B if i_pos < 0 and w_pos < 0 else (I if i_pos < 0 else W)
        raise ScheduleError(
            f"rank {r} never runs {Action(stage, kind, mb)}: every F needs its backward (B, or I and W)"
        )
    if max(b_pos, i_pos) < f_pos:
        back = Action(stage, B if b_pos >= 0 else I, mb)
        raise ScheduleError(f"rank {r} runs {back} before {Action(stage, F, mb)}: put the forward first")
    raise ScheduleError(f"rank {r} runs {Action(stage, W, mb)} before {Action(stage, I, mb)}: W needs I first")
