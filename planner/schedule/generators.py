"""The order of each looped schedule: (P, M, V) -> each rank's compute actions, in order.

The orders equal those torch.distributed.pipelining executes for the same schedule (tested
against torch in tests/schedule/test_torch_parity.py); zb_h2 has no torch class and follows
the paper's hand-crafted schedule. Actions carry global virtual-stage ids: with the looped
placement chunk c of rank r is stage c*P + r. The V-shaped schedules are in v_schedules.py,
chimera.py and seq1f1b.py; `registry.generate` picks a schedule's generator by name.
"""

from __future__ import annotations

from planner.schedule.actions import Action, ActionType, B, F, I, PipelineOrder, W


def interleave_rounds(pp: int, num_microbatches: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of torch's interleaved schedules.

    torch relaxes Megatron's "M multiple of P": micro-batches go through the chunks in
    rounds = max(1, M // P) groups of M / rounds, which needs M % rounds == 0.
    """
    rounds = max(1, num_microbatches // pp)
    return rounds, num_microbatches // rounds


def gpipe(pp: int, num_microbatches: int) -> PipelineOrder:
    """GPipe fill-drain (Huang et al. 2019): all M forwards, then all M backwards.

    Backwards run in micro-batch order 0..M-1, as torch's ScheduleGPipe does.
    """
    return {
        r: [Action(r, F, m) for m in range(num_microbatches)] + [Action(r, B, m) for m in range(num_microbatches)]
        for r in range(pp)
    }


def looped_bfs(pp: int, num_microbatches: int, vpp: int) -> PipelineOrder:
    """Breadth-first looped schedule (Lamy-Poirier 2023; torch ScheduleLoopedBFS).

    Each rank runs every micro-batch's forward through its chunks in order (chunk 0 first),
    then the backwards chunk by chunk from the last, micro-batches in reverse order.
    """
    order: PipelineOrder = {}
    for r in range(pp):
        stages = [c * pp + r for c in range(vpp)]
        order[r] = [Action(s, F, m) for s in stages for m in range(num_microbatches)] + [
            Action(s, B, m) for s in reversed(stages) for m in reversed(range(num_microbatches))
        ]
    return order


def _numbered(chunks: list[int], rank: int, pp: int, kind: ActionType) -> list[Action]:
    """One `kind` action per entry of `chunks` (looped stage chunk*P + rank), micro-batches
    numbered in order within each chunk."""
    count = [0] * (max(chunks) + 1)
    out = []
    for chunk in chunks:
        out.append(Action(chunk * pp + rank, kind, count[chunk]))
        count[chunk] += 1
    return out


def _warmup_then_steady(
    rank: int,
    pp: int,
    num_microbatches: int,
    vpp: int,
    *,
    warmup: int,
    per_round: int,
    split_backward: bool,
    weight_delay: int = 0,
) -> list[Action]:
    """The 1F1B family on one rank: `warmup` forwards, then (F, B) pairs, then the last backwards.

    The k-th forward of the rank runs chunk (k // per_round) % V and the k-th backward chunk
    V-1 - (k // per_round) % V (Megatron's depth-first interleaving in rounds of `per_round`
    micro-batches); micro-batches go in order within a chunk. With `split_backward` each
    backward is an I, and the W of the k-th I follows the (k + weight_delay)-th I (ZB-H1's
    delayed weight gradients); the last `weight_delay` W's close the rank's list.
    """
    total = vpp * num_microbatches
    chunks = [(k // per_round) % vpp for k in range(total)]
    forwards = _numbered(chunks, rank, pp, F)
    backwards = _numbered([vpp - 1 - c for c in chunks], rank, pp, I if split_backward else B)
    weights = [Action(stage, W, mb) for stage, _, mb in backwards] if split_backward else []
    out = forwards[:warmup]
    for k in range(total):
        if k < total - warmup:
            out.append(forwards[warmup + k])
        out.append(backwards[k])
        if split_backward and k >= weight_delay:
            out.append(weights[k - weight_delay])
    out += weights[max(0, total - weight_delay) :]
    return out


def one_f_one_b(pp: int, num_microbatches: int) -> PipelineOrder:
    """1F1B / PipeDream-flush (DAPPLE, Fan et al. 2021; torch Schedule1F1B).

    Rank r runs min(M, P-1-r) warm-up forwards, then alternates one forward and one
    backward, then drains; at most P-r micro-batches are in flight on rank r.
    """
    return {
        r: _warmup_then_steady(
            r,
            pp,
            num_microbatches,
            1,
            warmup=min(pp - 1 - r, num_microbatches),
            per_round=num_microbatches,
            split_backward=False,
        )
        for r in range(pp)
    }


def interleaved_1f1b(pp: int, num_microbatches: int, vpp: int) -> PipelineOrder:
    """Interleaved 1F1B (Narayanan et al. 2021; torch ScheduleInterleaved1F1B), V >= 2 chunks.

    Warm-up on rank r: (V-1)*R + 2*(P-1-r) forwards (capped at V*M), R = micro-batches per
    round = M / max(1, M // P) (R = P when M is a multiple of P, Megatron's case).
    """
    _, per_round = interleave_rounds(pp, num_microbatches)
    return {
        r: _warmup_then_steady(
            r,
            pp,
            num_microbatches,
            vpp,
            warmup=min((vpp - 1) * per_round + 2 * (pp - 1 - r), vpp * num_microbatches),
            per_round=per_round,
            split_backward=False,
        )
        for r in range(pp)
    }


def zb_h1(pp: int, num_microbatches: int, vpp: int = 1) -> PipelineOrder:
    """ZB-H1 (Qi et al. 2024, section 2.1); for V >= 2 torch's interleaved ZB1P.

    1F1B with the backward split into I and W: warm-up (V-1)*R + (P-1-r) forwards (R as in
    interleaved_1f1b), and rank r delays each W by r backwards, so every rank holds the same
    (V-1)*R + P micro-batch chunks until their W (P at V=1: the first rank's 1F1B peak), and
    (V-1)*R + P - r until their I, while I's reach the first stage sooner. Each rank idles
    (P-1)(F+I-W) per chunk costs (W <= min(F, I), M >= P) instead of 1F1B's (P-1)(F+I+W).
    Equals torch's ScheduleInterleavedZeroBubble for every V.
    """
    _, per_round = interleave_rounds(pp, num_microbatches)
    return {
        r: _warmup_then_steady(
            r,
            pp,
            num_microbatches,
            vpp,
            warmup=min((vpp - 1) * per_round + (pp - 1 - r), vpp * num_microbatches),
            per_round=per_round,
            split_backward=True,
            weight_delay=r,
        )
        for r in range(pp)
    }


def zb_h2(pp: int, num_microbatches: int) -> PipelineOrder:
    """ZB-H2 (Qi et al. 2024, section 2.2): zero bubble for M >= 2P-1 with F = I = W.

    Rank r runs n = min(M, 2(P-1-r)+1) warm-up forwards (filling the wait for the first I),
    then steady triples (I, W, F) while the pipeline is full, then (I, F) pairs that defer W so
    the I's of the last micro-batches race back to rank 0, then (I, W) pairs and the deferred
    W's. Each rank's busy span is then exactly M(F+I+W) (the paper's parallelogram); peak
    in-flight is 2P-1 on every rank counted until W, n counted until I.
    """
    m = num_microbatches
    order: PipelineOrder = {}
    for r in range(pp):
        warmup = min(m, 2 * (pp - 1 - r) + 1)
        triples = max(0, m - 2 * pp + 1)
        pairs = m - warmup - triples
        out = [Action(r, F, k) for k in range(warmup)]
        f = warmup
        for k in range(triples):
            out += [Action(r, I, k), Action(r, W, k), Action(r, F, f)]
            f += 1
        for k in range(triples, triples + pairs):
            out += [Action(r, I, k), Action(r, F, f)]
            f += 1
        w = triples
        for k in range(triples + pairs, m):
            out += [Action(r, I, k), Action(r, W, w)]
            w += 1
        out += [Action(r, W, k) for k in range(w, m)]
        order[r] = out
    return order
