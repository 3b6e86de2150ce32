"""Closed forms of each schedule under uniform costs: its bubble fraction, the activations each
rank holds at most, and the shape rules torch adds to "positive and an allowed V".

Uniform means every chunk of every rank costs the same forward f, input-grad i and
weight-grad w per micro-batch, with no communication; for the split schedules
f = i = w (the zero-bubble paper's section-2 assumption), for the others any f : (i + w).
The fraction is the paper's: idle time within the longest rank span over that span.
Per rank, with t = f = i = w and busy time 3*V*M*t, the idle time x*t is:

| schedule | x | source |
|---|---|---|
| gpipe, 1f1b | 3(P-1) | GPipe; DAPPLE: (P-1)/(M+P-1) |
| interleaved_1f1b, looped_bfs | 3(P-1) + 3(V-1)max(0, P-M) | Megatron 2021: (P-1)/(VM+P-1) for M >= P |
| zb_h1, V = 1 | (P-1) + max(0, P-M) | Qi et al. 2024: (P-1)(F+I-W) per rank, M >= P |
| zb_h1, V >= 2, M >= P | P-1 | torch's interleaved ZB1P: (P-1)(f+i-w) per rank |
| zb_h2 | max(0, 2P-1-M) | Qi et al. 2024: zero once M >= 2P-1 |
| zbv | 2 max(0, 2P-1-M) | Qi et al. 2024 (ZB-V): zero once M >= 2P-1 |
| dualpipev | P-1 | measured on torch's order, F and B of a pair run back to back |
| seq1f1b, k segments | 3(P-1) on busy 3kM (units of a segment) | Sun et al. 2024: (P-1)/(kM+P-1) |
| chimera, P even, M >= 2P | 2(P-2) on busy 3M (V=2 chunks, M/2 each) | Li & Hoefler 2021 |

Chimera's busy time per rank is M(F+B) (M/2 micro-batches per direction, one stage of each),
and it idles (P-2) B: with the paper's F = B this is its bubble (P-2)/(2M+P-2), with B = 2F
(f = i = w) 2(P-2)/(3M+2(P-2)). Derivation: each direction runs 1F1B with M/2 micro-batches,
whose fill on rank r (r forwards of the down pipeline, P-1-r of the up) and drain are the other
direction's work except for P-2 backward slots on every rank. Below M = 2P (the paper's basic
unit M = P) the two directions' 1F1B orders do not interleave without extra idle time.

The M < P terms and the zbv/dualpipev rows are derived from the schedules' orders and checked
against the simulator (tests/schedule/test_closed_form.py) over P <= 8, M <= 4P. A form that
returns None has no closed form at that shape: the caller simulates or counts on the order.
The bubble and in-flight forms take (P, M, V, k segments) for a shape its schedule's rules
accept; a shape rule takes (P, M, V) and returns what is wrong, worded to follow the schedule's
name, or None.
"""

from __future__ import annotations

from planner.schedule.generators import interleave_rounds


def _fraction(idle: float, pp: int, m: int, vpp: int) -> float:
    """Idle units over the span, for busy time 3 V M units per rank."""
    return idle / (3 * vpp * m + idle)


def fill_drain_bubble(pp: int, m: int, vpp: int, k: int) -> float:
    """GPipe and 1F1B: (P-1)/(M+P-1)."""
    return _fraction(3 * (pp - 1), pp, m, vpp)


def looped_bubble(pp: int, m: int, vpp: int, k: int) -> float:
    """Interleaved 1F1B and looped BFS: (P-1)/(VM+P-1) for M >= P, V-1 extra fills below."""
    return _fraction(3 * (pp - 1) + 3 * (vpp - 1) * max(0, pp - m), pp, m, vpp)


def zb_h1_bubble(pp: int, m: int, vpp: int, k: int) -> float | None:
    """ZB-H1: (P-1)(F+I-W) idle per rank; with V >= 2 only for M >= P."""
    if vpp == 1:
        return _fraction((pp - 1) + max(0, pp - m), pp, m, vpp)
    return _fraction(pp - 1, pp, m, vpp) if m >= pp else None


def zb_h2_bubble(pp: int, m: int, vpp: int, k: int) -> float:
    """ZB-H2: zero once M >= 2P-1."""
    return _fraction(max(0, 2 * pp - 1 - m), pp, m, vpp)


def zbv_bubble(pp: int, m: int, vpp: int, k: int) -> float:
    """ZB-V: zero once M >= 2P-1."""
    return _fraction(2 * max(0, 2 * pp - 1 - m), pp, m, vpp)


def dualpipev_bubble(pp: int, m: int, vpp: int, k: int) -> float:
    """DualPipeV: P-1 units per rank."""
    return _fraction(pp - 1, pp, m, vpp)


def seq1f1b_bubble(pp: int, m: int, vpp: int, k: int) -> float:
    """Seq1F1B: (P-1)/(kM+P-1), a segment being the unit."""
    return (pp - 1) / (k * m + pp - 1)


def chimera_bubble(pp: int, m: int, vpp: int, k: int) -> float | None:
    """Chimera with M >= 2P: 2(P-2)/(3M+2(P-2)) for B = 2F."""
    return 2 * (pp - 2) / (3 * m + 2 * (pp - 2)) if m >= 2 * pp else None


def gpipe_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """Every micro-batch: M."""
    return (m,) * pp


def one_f_one_b_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """P - r on rank r (at most M)."""
    return tuple(min(m, pp - r) for r in range(pp))


def looped_bfs_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """Every micro-batch of every chunk: M V."""
    return (m * vpp,) * pp


def interleaved_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """The warm-up (V-1)R + 2(P-1-r), plus one in steady state, R micro-batches per round."""
    _, per_round = interleave_rounds(pp, m)
    return tuple(min(m * vpp, (vpp - 1) * per_round + 2 * (pp - 1 - r) + 1) for r in range(pp))


def zb_h1_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """Warm-up (V-1)R + P-1-r, one more, and W trailing I by r backwards: (V-1)R + P."""
    _, per_round = interleave_rounds(pp, m)
    return (min(m * vpp, (vpp - 1) * per_round + pp),) * pp


def zb_h2_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """min(M, 2P-1)."""
    return (min(m, 2 * pp - 1),) * pp


def zbv_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...] | None:
    """2P once M >= 2P."""
    return (2 * pp,) * pp if m >= 2 * pp else None


def dualpipev_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """2P + 1."""
    return (2 * pp + 1,) * pp


def seq1f1b_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...]:
    """min(kM, P - r + k - 1) segments, each 1/k of a micro-batch."""
    return tuple(min(k * m, pp - r + k - 1) for r in range(pp))


def chimera_inflight(pp: int, m: int, vpp: int, k: int) -> tuple[int, ...] | None:
    """P + 1 once M >= 2P (P - r down, r + 1 up)."""
    return (pp + 1,) * pp if m >= 2 * pp else None


def one_f_one_b_shape(pp: int, m: int, vpp: int) -> str | None:
    """torch's Schedule1F1B needs M >= P."""
    if m < pp:
        return (
            f"needs at least as many micro-batches as stages (as torch's Schedule1F1B): "
            f"got microbatches={m} < stages={pp}; use microbatches >= {pp} or gpipe"
        )
    return None


def interleaved_shape(pp: int, m: int, vpp: int) -> str | None:
    """torch's interleaved schedules run M in max(1, M // P) equal rounds when V >= 2."""
    rounds, per_round = interleave_rounds(pp, m)
    if vpp >= 2 and m % rounds:
        good = sorted({per_round * rounds, (per_round + 1) * rounds, pp * rounds})
        return (
            f"with vpp={vpp} runs micro-batches in max(1, M // stages) = {rounds} equal rounds (as torch "
            f"does), but microbatches={m} is not a multiple of {rounds}; use e.g. microbatches in {good}"
        )
    return None


def dualpipev_shape(pp: int, m: int, vpp: int) -> str | None:
    """torch's ScheduleDualPipeV needs M >= 2P."""
    if m < 2 * pp:
        return (
            f"needs at least 2 x stages micro-batches (as torch's ScheduleDualPipeV): "
            f"got microbatches={m} < {2 * pp}; use microbatches >= {2 * pp} or zbv"
        )
    return None


def chimera_shape(pp: int, m: int, vpp: int) -> str | None:
    """Even depth (each direction's fill is the other's drain) and M split evenly in two."""
    if pp % 2:
        return (
            f"needs an even number of stages (as Li & Hoefler 2021: each direction's fill "
            f"is the other's drain only for even depth); got stages={pp}"
        )
    if m % 2:
        return f"sends half the micro-batches down and half up, so microbatches must be even; got {m}, use {m + 1}"
    return None
