"""The search's bounds never exceed what the simulator finds, and the held counts it uses
for memory agree with the simulator's own activation peaks."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.pipeline import ChunkCosts
from planner.schedule import SCHEDULES, StageCosts, check_shape, compile_schedule, generate, peak_held_counts, simulate
from planner.search.bounds import FIRST_CHUNK_SHARE, layout_bound, work_bound


@st.composite
def shapes(draw):
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    info = SCHEDULES[name]
    pp = draw(st.integers(2, 5))
    vpp = draw(st.integers(info.min_vpp, min(info.max_vpp or 3, 3)))
    m = draw(st.integers(1, 12))
    try:
        check_shape(name, pp, m, vpp)
    except Exception:
        m = 2 * pp * vpp  # every schedule accepts this many
        check_shape(name, pp, m, vpp)
    return name, pp, m, vpp


def _table(draw, pp, vpp, lo, hi):
    return tuple(tuple(draw(st.floats(lo, hi)) for _ in range(vpp)) for _ in range(pp))


@settings(max_examples=150, deadline=None)
@given(shapes(), st.data())
def test_layout_bound_never_exceeds_the_simulated_step(shape, data):
    name, pp, m, vpp = shape
    draw = data.draw
    f, i, w = (_table(draw, pp, vpp, 0.1, 3.0) for _ in range(3))
    p2p = draw(st.floats(0.0, 0.5))
    acts = _table(draw, pp, vpp, 1.0, 5.0)
    sim = simulate(compile_schedule(name, pp, m, vpp),
                   StageCosts(forward_s=f, backward_input_s=i, backward_weight_s=w, p2p_s=p2p, activation_bytes=acts))
    costs = ChunkCosts(forward_s=[list(r) for r in f], backward_input_s=[list(r) for r in i],
                       backward_weight_s=[list(r) for r in w], activation_bytes=[list(r) for r in acts],
                       extra_bytes=[0.0] * pp, params=[0.0] * pp, tp_comm_s=[0.0] * pp, p2p_s=p2p)
    bound = layout_bound(costs, m, SCHEDULES[name].split_backward)
    assert bound <= sim.step_time_s * (1 + 1e-9)
    # held counts give the simulator's activation peak without simulating
    held = peak_held_counts(generate(name, pp, m, vpp), vpp)
    for r in range(pp):
        peak = max(sum(n * b for n, b in zip(v, acts[r])) for v in held[r])
        assert math.isclose(peak, sim.peak_activation_bytes[r], rel_tol=1e-9)
        assert max(sum(v) for v in held[r]) == sim.peak_inflight[r]


@settings(max_examples=150, deadline=None)
@given(shapes(), st.data())
def test_work_bound_never_exceeds_the_simulated_step(shape, data):
    """Any spread of the work over ranks, with first chunks holding their share."""
    name, pp, m, vpp = shape
    draw = data.draw
    split = SCHEDULES[name].split_backward
    forward_share = draw(st.floats(0.2, 0.5))
    rank_work = [draw(st.floats(0.5, 5.0)) for _ in range(pp)]
    f, i, w = [], [], []
    for work in rank_work:
        # first chunk largest (as the solver's cuts put it), the rest equal
        first = work * draw(st.floats(1.0 / vpp, 1.0)) if vpp > 1 else work
        rest = [(work - first) / (vpp - 1)] * (vpp - 1) if vpp > 1 else []
        chunks = [first, *rest]
        f.append(tuple(c * forward_share for c in chunks))
        i.append(tuple(c * (1 - forward_share) / 2 for c in chunks))
        w.append(tuple(c * (1 - forward_share) / 2 for c in chunks))
    sim = simulate(compile_schedule(name, pp, m, vpp),
                   StageCosts(forward_s=tuple(f), backward_input_s=tuple(i), backward_weight_s=tuple(w)))
    share = FIRST_CHUNK_SHARE / vpp * (forward_share if split else 1.0)
    assert work_bound(sum(rank_work), share, m, pp) <= sim.step_time_s * (1 + 1e-9)


def test_work_bound_closed_forms():
    """No bubble as the first-chunk share vanishes; 1F1B's (M + P - 1) / M with uniform work."""
    assert work_bound(8.0, 0.0, 16, 4) == 16 * 8.0 / 4
    m, p, w = 16, 4, 8.0
    # c = 1: T = W / (1 - (1 - 1/M)^P) lies between uniform 1F1B's M W / P and (M + P - 1) W / P
    t = work_bound(w, 1.0, m, p)
    assert m * w / p < t <= (m + p - 1) * w / p
