"""Lower bounds on the simulated step time, used to discard candidates without simulating.

The chain bound. Pipeline rank r runs its actions one at a time, and its first action, the
forward of micro-batch 0 on its first chunk, cannot start before that micro-batch has gone
through the first chunk of every earlier rank. With x_r the work of one micro-batch on rank
r (forward and backward of all its chunks) and f_k the forward of rank k's first chunk,

    step >= sum_{k<r} f_k + M x_r                               (every schedule)
    step >= sum_{k<r} (f_k + b_k) + M x_r                       (full backward, B)

where b_k is the backward of rank k's first chunk: with a fused backward, rank r's last
action is the backward of the last micro-batch on its first stage, after which that
micro-batch's backward still has to cross ranks r-1 .. 0. Split-backward schedules can fill
that tail with deferred W, so they get the first form only.

Before cut points are known (`work_bound`), each first chunk is at least a share `c` of the
rank's work, so the bound becomes min over x >= 0 with sum x = W of max_r (c S_r + M x_r),
reached when all P terms are equal: T = c W / (1 - (1 - c/M)^P); it tends to M W / P (no
bubble) as c -> 0 and adds the familiar (P - 1)/M fill-and-drain share for c = 1. For cuts
whose first virtual stage holds only the embedding (as Llama 3 405B trained) rank 0 adds
nothing to the chain: T = W / (1/M + (1 - (1 - c/M)^(P-1)) / c).
"""

from __future__ import annotations

from planner.pipeline import ChunkCosts

FIRST_CHUNK_SHARE = 0.5
"""Least share of a rank's transformer layers in its first chunk, over V: both the solver's
cuts (first chunk gets ceil(n / V)) and even cuts (stage sizes within one layer of each
other, so the first chunk has at least half of n / V) satisfy it."""


def work_bound(work_s: float, first_chunk_share: float, num_microbatches: int, pp: int,
               empty_first_stage: bool = False) -> float:
    """Least step time over every way of spreading `work_s` (one micro-batch, all ranks) over
    `pp` ranks, when each rank's first chunk holds at least `first_chunk_share` of its work
    (all but rank 0 when its first stage holds only the embedding)."""
    m, c = num_microbatches, first_chunk_share
    if pp == 1 or c <= 0:
        return m * work_s / pp
    if empty_first_stage:  # the chain starts at rank 1: T = M x_0, ranks 1 .. P-1 equalise
        return work_s / (1.0 / m + (1.0 - (1.0 - c / m) ** (pp - 1)) / c)
    return c * work_s / (1.0 - (1.0 - c / m) ** pp)


def layout_bound(costs: ChunkCosts, num_microbatches: int, split_backward: bool,
                 after_s: list[float] | None = None, bidirectional: bool = False) -> float:
    """The chain bound of one layout (cut points known), pipeline part only. With `after_s`,
    also each rank's end plus what it runs after its last action (its exposed DP
    communication): rank r ends no earlier than sum_{k<r} f_k + M x_r (the forward chain; the
    backward chain's part runs after rank r's last action).

    Under seq1f1b the units are the kM equal-cost segments. `bidirectional` (Chimera):
    each stage runs M/2 micro-batches and rank r may start with either direction, so its
    chain is the shorter of the down chain (ranks 0..r-1, chunk 0) and the up one (ranks
    P-1..r+1, chunk 1)."""
    if bidirectional:
        return _bidirectional_bound(costs, num_microbatches // 2, after_s)
    m = num_microbatches * costs.segments
    best = chain = forward_chain = 0.0
    for rank in range(len(costs.forward_s)):
        busy = sum(costs.forward_s[rank]) + sum(costs.backward_input_s[rank]) + sum(costs.backward_weight_s[rank])
        best = max(best, chain + m * busy)
        if after_s is not None:
            best = max(best, forward_chain + m * busy + after_s[rank])
        first = costs.forward_s[rank][0] + costs.p2p_s
        forward_chain += first
        if not split_backward:
            first += costs.backward_input_s[rank][0] + costs.backward_weight_s[rank][0] + costs.p2p_s
        chain += first
    return best


def _bidirectional_bound(costs: ChunkCosts, per_direction: int, after_s: list[float] | None) -> float:
    """Chimera's bound: rank r starts no earlier than the shorter of its two forward chains
    and is then busy with M/2 micro-batches on each of its two chunks."""
    pp = len(costs.forward_s)
    down = [0.0] * pp
    up = [0.0] * pp
    for rank in range(1, pp):
        down[rank] = down[rank - 1] + costs.forward_s[rank - 1][0] + costs.p2p_s
    for rank in range(pp - 2, -1, -1):
        up[rank] = up[rank + 1] + costs.forward_s[rank + 1][1] + costs.p2p_s
    best = 0.0
    for rank in range(pp):
        busy = sum(costs.forward_s[rank]) + sum(costs.backward_input_s[rank]) + sum(costs.backward_weight_s[rank])
        end = min(down[rank], up[rank]) + per_direction * busy
        best = max(best, end + (after_s[rank] if after_s is not None else 0.0))
    return best
