"""Chimera (Li & Hoefler, SC'21): two 1F1B pipelines in opposite directions over the same ranks.

The "down" pipeline runs stages 0..P-1 on ranks 0..P-1, the "up" pipeline stages P..2P-1 on
ranks P-1..0, so rank r holds stage r (down position r) and stage 2P-1-r (up position P-1-r):
the V placement of ZB-V, chunk 0 = down, chunk 1 = up. Unlike ZB-V the two directions are
separate pipelines holding two replicas of the same model: stage P starts a pipeline of its
own (`registry.pipeline_starts`), each rank holds the weights of two model stages, and after
the step the two replicas of a stage all-reduce their gradients. Half the step's M
micro-batches go down, half up (the paper's split); micro-batch indices are per direction,
0..M/2-1 on each (an order of this schedule has M/2 micro-batches per stage).

Each direction runs 1F1B on its M/2 micro-batches (the paper's basic unit is M = P, P/2 per
direction; longer steps keep 1F1B's steady state instead of concatenating units). Each rank
runs its two stages' actions in the order of their start times in the two pipelines' own
uniform-cost timelines (forward 1, backward 1: the paper's accounting in which one
direction's fill and drain bubbles are the other's busy slots), the up pipeline second on a
tie.
"""

from __future__ import annotations

from planner.schedule.actions import Action, B, F, PipelineOrder
from planner.schedule.generators import one_f_one_b


def _one_f_one_b_starts(pp: int, num_microbatches: int) -> dict[Action, float]:
    """Start time of each action of 1F1B on `pp` ranks with forward = backward = 1 and no
    transfer time (M < P allowed: the warm-up is min(P-1-r, M) forwards)."""
    order = one_f_one_b(pp, num_microbatches)
    end: dict[Action, float] = {}
    start: dict[Action, float] = {}
    position = [0] * pp
    free = [0.0] * pp
    remaining = sum(len(actions) for actions in order.values())
    while remaining:
        for r in range(pp):
            while position[r] < len(order[r]):
                action = order[r][position[r]]
                stage, kind, mb = action
                if kind == F:
                    dep = Action(stage - 1, F, mb) if stage > 0 else None
                else:
                    dep = Action(stage + 1, B, mb) if stage < pp - 1 else None
                if dep is not None and dep not in end:
                    break
                begin = max(free[r], end[dep] if dep is not None else 0.0)
                start[action] = begin
                end[action] = free[r] = begin + 1.0
                position[r] += 1
                remaining -= 1
    return start


def chimera(pp: int, num_microbatches: int) -> PipelineOrder:
    """Chimera's order for P ranks and M micro-batches (M even: M/2 per direction)."""
    per_direction = num_microbatches // 2
    start = _one_f_one_b_starts(pp, per_direction)
    merged: dict[int, list[tuple[float, int, Action]]] = {r: [] for r in range(pp)}
    for (position, kind, mb), t in start.items():
        merged[position].append((t, 0, Action(position, kind, mb)))
        merged[pp - 1 - position].append((t, 1, Action(pp + position, kind, mb)))
    return {r: [a for _, _, a in sorted(merged[r], key=lambda e: (e[0], e[1]))] for r in range(pp)}
