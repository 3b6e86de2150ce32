"""Closed-form bubble fractions for uniform costs, for pruning before simulating.

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
and it idles (P-2) B: with the paper's F = B this is its bubble (P-2)/(2M+P-2)
(`chimera_paper_bubble`), with B = 2F (f = i = w) 2(P-2)/(3M+2(P-2)). Derivation: each
direction runs 1F1B with M/2 micro-batches, whose fill on rank r (r forwards of the down
pipeline, P-1-r of the up) and drain are the other direction's work except for P-2 backward
slots on every rank. Below M = 2P (the paper's basic unit M = P) the two directions' 1F1B
orders do not interleave without extra idle time; it is simulated.

The M < P terms and the zbv/dualpipev rows are derived from the schedules' orders and
checked against the simulator (tests/schedule/test_closed_form.py) over P <= 8, M <= 4P.
zb_h1 with V >= 2 and M < P has no closed form here: it is computed by simulating.
"""

from __future__ import annotations

from planner.schedule.costs import StageCosts
from planner.schedule.generators import interleave_rounds
from planner.schedule.registry import check_shape
from planner.schedule.simulate import compile_schedule, simulate


def _idle_units(name: str, pp: int, m: int, vpp: int) -> float | None:
    """Per-rank idle time in units of one chunk's forward (f = i = w), or None if unknown."""
    if name in ("gpipe", "1f1b"):
        return 3 * (pp - 1)
    if name in ("interleaved_1f1b", "looped_bfs"):
        return 3 * (pp - 1) + 3 * (vpp - 1) * max(0, pp - m)
    if name == "zb_h1":
        if vpp == 1:
            return (pp - 1) + max(0, pp - m)
        return pp - 1 if m >= pp else None
    if name == "zb_h2":
        return max(0, 2 * pp - 1 - m)
    if name == "zbv":
        return 2 * max(0, 2 * pp - 1 - m)
    assert name == "dualpipev", name
    return pp - 1


def bubble_closed_form(name: str, pp: int, num_microbatches: int, vpp: int = 1, segments: int = 1) -> float:
    """Bubble fraction of schedule `name` at (P, M, V) with uniform costs (see module table).

    Equals `simulate(...).bubble_fraction` for uniform f = i = w and zero communication;
    ScheduleError where the schedule is not defined for (P, M, V).
    """
    check_shape(name, pp, num_microbatches, vpp, segments)
    if name == "seq1f1b":
        return (pp - 1) / (segments * num_microbatches + pp - 1)
    if name == "chimera":
        if num_microbatches >= 2 * pp:
            return 2 * (pp - 2) / (3 * num_microbatches + 2 * (pp - 2))
        costs = StageCosts.uniform(pp, vpp, 1.0, 1.0, 1.0)
        return simulate(compile_schedule(name, pp, num_microbatches, vpp), costs).bubble_fraction
    idle = _idle_units(name, pp, num_microbatches, vpp)
    if idle is None:
        costs = StageCosts.uniform(pp, vpp, 1.0, 1.0, 1.0)
        return simulate(compile_schedule(name, pp, num_microbatches, vpp), costs).bubble_fraction
    return idle / (3 * vpp * num_microbatches + idle)


def chimera_paper_bubble(pp: int, num_microbatches: int) -> float:
    """Chimera's bubble (D-2)/(2N+D-2) for D = `pp` stages and N micro-batches, with forward
    and backward of equal cost (Li & Hoefler 2021, Table 1); the simulation equals it for
    N >= 2D (see the module docstring)."""
    return (pp - 2) / (2 * num_microbatches + pp - 2)


def zb_h1_idle_time(pp: int, forward: float, backward_input: float, backward_weight: float) -> float:
    """Per-rank idle time of ZB-H1 (V = 1, M >= P): (P-1)(F + I - W), Qi et al. 2024 section 2.1.

    The paper derives it for F = I = W; it holds whenever W <= min(F, I) (checked by
    simulation in the tests). Compare 1F1B's (P-1)(F + I + W).
    """
    return (pp - 1) * (forward + backward_input - backward_weight)


def inflight_closed_form(
    name: str, pp: int, num_microbatches: int, vpp: int, segments: int = 1
) -> tuple[int, ...] | None:
    """Most micro-batch x chunk activations each rank holds at once (F start to the end of its
    B or W), where a closed form is known; None otherwise (then count on the order).

    gpipe M; 1f1b P - r; looped_bfs M V; zb_h2 min(M, 2P - 1); with R micro-batches per
    interleaving round (`interleave_rounds`; R = P when P divides M): interleaved_1f1b
    min(M V, (V - 1) R + 2(P - 1 - r) + 1) (the warm-up plus the one in steady state), zb_h1
    min(M V, (V - 1) R + P) (min(M, P) at V = 1); zbv with M >= 2P: 2P; dualpipev 2P + 1;
    seq1f1b min(kM, P - r + k - 1) segments (each 1/k of a micro-batch); chimera with
    M >= 2P: P + 1 (P - r down, r + 1 up).
    Checked against the orders in tests/schedule/test_closed_form.py.
    """
    p, m, v = pp, num_microbatches, vpp
    check_shape(name, p, m, v, segments)
    if name == "seq1f1b":
        return tuple(min(segments * m, p - r + segments - 1) for r in range(p))
    if name == "chimera":
        return (p + 1,) * p if m >= 2 * p else None
    if name == "gpipe":
        return (m,) * p
    if name == "1f1b":
        return tuple(min(m, p - r) for r in range(p))
    if name == "looped_bfs":
        return (m * v,) * p
    if name == "zb_h2":
        return (min(m, 2 * p - 1),) * p
    _, per_round = interleave_rounds(p, m)
    if name == "interleaved_1f1b":  # the warm-up, then one more in steady state
        return tuple(min(m * v, (v - 1) * per_round + 2 * (p - 1 - r) + 1) for r in range(p))
    if name == "zb_h1":  # warm-up (V-1)R + P-1-r, then one more, and W trails I by r backwards
        return (min(m * v, (v - 1) * per_round + p),) * p
    if name == "zbv" and m >= 2 * p:
        return (2 * p,) * p
    if name == "dualpipev":
        return (2 * p + 1,) * p
    return None
