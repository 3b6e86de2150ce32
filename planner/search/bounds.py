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


def work_bound(
    work_s: float, first_chunk_share: float, num_microbatches: int, pp: int, empty_first_stage: bool = False
) -> float:
    """Least step time over every way of spreading `work_s` (one micro-batch, all ranks) over
    `pp` ranks, when each rank's first chunk holds at least `first_chunk_share` of its work
    (all but rank 0 when its first stage holds only the embedding)."""
    m, c = num_microbatches, first_chunk_share
    if pp == 1 or c <= 0:
        return m * work_s / pp
    if empty_first_stage:  # the chain starts at rank 1: T = M x_0, ranks 1 .. P-1 equalise
        return work_s / (1.0 / m + (1.0 - (1.0 - c / m) ** (pp - 1)) / c)
    return c * work_s / (1.0 - (1.0 - c / m) ** pp)


def round_trip_bound(forward_s: float, backward_s: float, num_units: int, stages: int) -> float:
    """Least step time of `num_units` micro-batches (seq1f1b: segments) over `stages`
    virtual stages whatever the cuts, when one of them takes `forward_s` through all stages
    and `backward_s` (input-gradient part of a split backward) back: the round trip plus
    (M - 1) times the mean stage's forward or backward, the larger.

    `sequencing_bound`'s sets of one stage s give round trip + (M - 1) f_s and round trip +
    (M - 1) b_s; the largest stage holds at least the mean share. Tight where the chain
    bound is weakest: few micro-batches on many virtual stages."""
    return forward_s + backward_s + (num_units - 1) * max(forward_s, backward_s) / stages


def layout_bound(
    costs: ChunkCosts,
    num_microbatches: int,
    split_backward: bool,
    after_s: list[float] | None = None,
    bidirectional: bool = False,
) -> float:
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


def sequencing_bound(
    costs: ChunkCosts,
    num_microbatches: int,
    split_backward: bool,
    v_shaped: bool = False,
    after_s: list[float] | None = None,
) -> float:
    """A lower bound of the pipeline's end (with `after_s`, of each rank's end plus what it runs
    after its last action) under any order of the actions, cut points known; at least the
    chain bound of `layout_bound` and much closer to the simulated step when M is small
    against P x V.

    Single-machine argument. The actions of a set X on rank r run one at a time, so the last
    of them ends no earlier than the earliest start any of them can have (its head) plus
    their total time, and the step after that plus the least path any of them still heads
    (its tail). Heads and tails are dependency paths of one micro-batch through stages
    s = 0 .. S-1 (S = P V, model order; p the p2p time where consecutive stages are on
    different ranks; b_s = I of a split backward, I + W of a full one B):

        head of F(s): sum_{s'<s} (f_s' + p)            tail of I/B(s): sum_{s'<s} (b_s' + p) + w_0
        head of I/B(s): forward to S-1, then b of S-1 .. s+1     tail of F(s): the rest of the
        forward, then every backward to stage 0 (the tails end on rank 0: W(m, 0) or B(m, 0))

    With stages s_a < .. < s_b the chunks a .. b of rank r, the sets are: all actions of
    chunks >= a (tail 0, rank r's own end); the forwards and backwards (I or B) of chunks
    >= a (head F(s_a), tail of the backward on s_a: an I(m, s_a) needs every F and I of m
    on rank r first); the forwards of chunks a .. b (head F(s_a), tail F(s_b)); the
    backwards of chunks a .. b (head of the backward on s_b, tail of the one on s_a).
    Under seq1f1b the units are the kM equal-cost segments. Not for chimera (two pipelines)."""
    pp, vpp = len(costs.forward_s), len(costs.forward_s[0])
    m = num_microbatches * costs.segments
    if v_shaped:
        where = [(r, 0) for r in range(pp)] + [(r, 1) for r in range(pp - 1, -1, -1)]
        rank_stages = [(r, 2 * pp - 1 - r) for r in range(pp)]
    else:
        where = [(s % pp, s // pp) for s in range(pp * vpp)]
        rank_stages = [tuple(range(r, pp * vpp, pp)) for r in range(pp)]
    fwd, bwd_in, bwd_w = costs.forward_s, costs.backward_input_s, costs.backward_weight_s
    f = [fwd[r][c] for r, c in where]
    w = [bwd_w[r][c] for r, c in where] if split_backward else [0.0] * len(where)
    b = [bwd_in[r][c] if split_backward else bwd_in[r][c] + bwd_w[r][c] for r, c in where]
    hop = [0.0] + [costs.p2p_s if where[s - 1][0] != where[s][0] else 0.0 for s in range(1, len(where))]
    """hop[s]: the link between stages s-1 and s."""
    stages = len(where)
    head_f = [0.0] * stages
    tail_b = [0.0] * stages
    tail_b[0] = w[0]
    for s in range(1, stages):
        head_f[s] = head_f[s - 1] + f[s - 1] + hop[s]
        tail_b[s] = tail_b[s - 1] + b[s - 1] + hop[s]
    head_b = [0.0] * stages
    tail_f = [0.0] * stages
    head_b[-1] = head_f[-1] + f[-1]
    tail_f[-1] = b[-1] + tail_b[-1]
    for s in range(stages - 2, -1, -1):
        head_b[s] = head_b[s + 1] + b[s + 1] + hop[s + 1]
        tail_f[s] = tail_f[s + 1] + f[s + 1] + hop[s + 1]
    own_after = after_s if after_s is not None else [0.0] * pp
    first_after = own_after[0]
    best = 0.0
    for rank, mine in enumerate(rank_stages):
        work = both = 0.0
        for s in reversed(mine):
            work += f[s] + b[s] + w[s]
            both += f[s] + b[s]
            best = max(best, head_f[s] + m * work + own_after[rank], head_f[s] + m * both + tail_b[s] + first_after)
        for a, low in enumerate(mine):
            forwards = backwards = 0.0
            for high in mine[a:]:
                forwards += f[high]
                backwards += b[high]
                best = max(
                    best,
                    head_f[low] + m * forwards + tail_f[high] + first_after,
                    head_b[high] + m * backwards + tail_b[low] + first_after,
                )
    return best
