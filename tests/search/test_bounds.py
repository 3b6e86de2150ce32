"""The search's bounds never exceed what the simulator finds (time and memory), and the
held counts it uses for memory agree with the simulator's own activation peaks."""

from __future__ import annotations

import math
from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st
from search_reference import draw_layout

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel
from planner.pipeline import ChunkCosts
from planner.predict import predict
from planner.schedule import SCHEDULES, StageCosts, check_shape, compile_schedule, generate, peak_held_counts, simulate
from planner.search.bounds import FIRST_CHUNK_SHARE, layout_bound, round_trip_bound, sequencing_bound, work_bound
from planner.search.costing import (
    inflight_of,
    layout_memory_floor,
    memory_floor,
    parts_of,
    round_trip_floor,
)
from planner.search.space import Candidate, SearchSpace, candidates
from planner.spec import Cluster


@st.composite
def shapes(draw):
    name = draw(
        st.sampled_from(sorted(n for n, i in SCHEDULES.items() if i.searched_by_default))
    )  # the bounds serve the search
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
    sim = simulate(
        compile_schedule(name, pp, m, vpp),
        StageCosts(forward_s=f, backward_input_s=i, backward_weight_s=w, p2p_s=p2p, activation_bytes=acts),
    )
    costs = ChunkCosts(
        forward_s=[list(r) for r in f],
        backward_input_s=[list(r) for r in i],
        backward_weight_s=[list(r) for r in w],
        activation_bytes=[list(r) for r in acts],
        extra_bytes=[0.0] * pp,
        params=[0.0] * pp,
        tp_comm_s=[0.0] * pp,
        p2p_s=p2p,
    )
    bound = layout_bound(costs, m, SCHEDULES[name].split_backward)
    assert bound <= sim.step_time_s * (1 + 1e-9)
    # with work each rank runs after its last action (exposed DP communication)
    after = [draw(st.floats(0.0, 5.0)) for _ in range(pp)]
    ends = max(sim.step_time_s, *(sim.finish_s[r] + after[r] for r in range(pp)))
    assert layout_bound(costs, m, SCHEDULES[name].split_backward, after) <= ends * (1 + 1e-9)
    # held counts give the simulator's activation peak without simulating
    held = peak_held_counts(generate(name, pp, m, vpp), vpp)
    for r in range(pp):
        peak = max(sum(n * b for n, b in zip(v, acts[r])) for v in held[r])
        assert math.isclose(peak, sim.peak_activation_bytes[r], rel_tol=1e-9)
        assert max(sum(v) for v in held[r]) == sim.peak_inflight[r]


@st.composite
def shapes_with_segments(draw):
    """A searched schedule's shape, or seq1f1b's with k segments per micro-batch."""
    if draw(st.booleans()):
        return (*draw(shapes()), 1)
    pp, m, k = draw(st.integers(1, 5)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    return "seq1f1b", pp, max(m, pp), 1, k


@settings(max_examples=300, deadline=None)
@given(shapes_with_segments(), st.data())
def test_sequencing_bound_never_exceeds_the_simulated_step(shape, data):
    """Any costs (empty chunks included), p2p and work after each rank's last action: at
    most the simulated end, and at least the chain bound."""
    name, pp, m, vpp, k = shape
    draw = data.draw
    f, i, w = (_table(draw, pp, vpp, 0.0, 3.0) for _ in range(3))
    p2p = draw(st.floats(0.0, 0.5))
    sim = simulate(
        compile_schedule(name, pp, m, vpp, k),
        StageCosts(forward_s=f, backward_input_s=i, backward_weight_s=w, p2p_s=p2p),
    )
    costs = ChunkCosts(
        forward_s=[list(r) for r in f],
        backward_input_s=[list(r) for r in i],
        backward_weight_s=[list(r) for r in w],
        activation_bytes=[[0.0] * vpp] * pp,
        extra_bytes=[0.0] * pp,
        params=[0.0] * pp,
        tp_comm_s=[0.0] * pp,
        p2p_s=p2p,
        segments=k,
    )
    split, v_shaped = SCHEDULES[name].split_backward, SCHEDULES[name].v_shaped
    bound = sequencing_bound(costs, m, split, v_shaped)
    assert bound <= sim.step_time_s * (1 + 1e-9)
    assert bound >= layout_bound(costs, m, split and pp > 1) * (1 - 1e-9)
    after = [draw(st.floats(0.0, 5.0)) for _ in range(pp)]
    ends = max(sim.step_time_s, *(sim.finish_s[r] + after[r] for r in range(pp)))
    with_after = sequencing_bound(costs, m, split, v_shaped, after)
    assert with_after <= ends * (1 + 1e-9)
    assert with_after >= layout_bound(costs, m, split and pp > 1, after) * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs"]),
    st.integers(2, 5),
    st.integers(1, 3),
    st.data(),
)
def test_sequencing_bound_of_one_micro_batch_is_its_round_trip(name, pp, vpp, data):
    """With one micro-batch every schedule runs it through all P x V stages and back, one
    action at a time: the bound is exactly that sum (the chain bound holds only the first
    chunk of each rank)."""
    vpp = 1 if name in ("gpipe", "1f1b") else max(vpp, 2) if name == "interleaved_1f1b" else vpp
    draw = data.draw
    f, i, w = (_table(draw, pp, vpp, 0.1, 3.0) for _ in range(3))
    p2p = draw(st.floats(0.0, 0.5))
    costs = ChunkCosts(
        forward_s=[list(r) for r in f],
        backward_input_s=[list(r) for r in i],
        backward_weight_s=[list(r) for r in w],
        activation_bytes=[[0.0] * vpp] * pp,
        extra_bytes=[0.0] * pp,
        params=[0.0] * pp,
        tp_comm_s=[0.0] * pp,
        p2p_s=p2p,
    )
    round_trip = sum(map(sum, f)) + sum(map(sum, i)) + sum(map(sum, w)) + 2 * (pp * vpp - 1) * p2p
    bound = sequencing_bound(costs, 1, False)
    assert math.isclose(bound, round_trip, rel_tol=1e-12)
    if vpp > 1:
        assert layout_bound(costs, 1, False) < bound


@settings(max_examples=200, deadline=None)
@given(shapes_with_segments(), st.data())
def test_round_trip_bound_never_exceeds_the_simulated_step(shape, data):
    """Whatever the per-chunk costs: the whole model's forward and backward (input-gradient
    part when split) of one micro-batch give a floor of the simulated step."""
    name, pp, m, vpp, k = shape
    draw = data.draw
    f, i, w = (_table(draw, pp, vpp, 0.0, 3.0) for _ in range(3))
    sim = simulate(
        compile_schedule(name, pp, m, vpp, k),
        StageCosts(forward_s=f, backward_input_s=i, backward_weight_s=w, p2p_s=draw(st.floats(0.0, 0.5))),
    )
    forward, backward = sum(map(sum, f)), sum(map(sum, i))
    if not SCHEDULES[name].split_backward:
        backward += sum(map(sum, w))
    assert round_trip_bound(forward, backward, m * k, pp * vpp) <= sim.step_time_s * (1 + 1e-9)


def test_round_trip_bound_of_one_micro_batch_is_the_simulated_step():
    """One micro-batch runs its round trip and nothing else: 4 stages x (1 + 2 + 0.5) s."""
    sim = simulate(compile_schedule("gpipe", 4, 1, 1), StageCosts.uniform(4, 1, 1.0, 2.0, 0.5))
    assert sim.step_time_s == 14.0
    assert round_trip_bound(4 * 1.0, 4 * 2.5, 1, 4) == 14.0


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
    sim = simulate(
        compile_schedule(name, pp, m, vpp),
        StageCosts(forward_s=tuple(f), backward_input_s=tuple(i), backward_weight_s=tuple(w)),
    )
    share = FIRST_CHUNK_SHARE / vpp * (forward_share if split else 1.0)
    assert work_bound(sum(rank_work), share, m, pp) <= sim.step_time_s * (1 + 1e-9)


def test_work_bound_closed_forms():
    """No bubble as the first-chunk share vanishes; 1F1B's (M + P - 1) / M with uniform work."""
    assert work_bound(8.0, 0.0, 16, 4) == 16 * 8.0 / 4
    m, p, w = 16, 4, 8.0
    # c = 1: T = W / (1 - (1 - 1/M)^P) lies between uniform 1F1B's M W / P and (M + P - 1) W / P
    t = work_bound(w, 1.0, m, p)
    assert m * w / p < t <= (m + p - 1) * w / p


SEQ, BATCH = 2048, 64


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_memory_floors_never_exceed_the_predicted_peak(data):
    """Any cuts (at least one layer per chunk, or empty end stages for such candidates)
    and any recompute mode per rank: the candidate's floor and the layout's floor are at
    most the memory `predict` finds."""
    model = _small_model()
    candidate, layout = _draw_layout(data, model)
    parts = parts_of(model, candidate, SEQ)
    inflight = inflight_of(candidate)
    peak = predict(model, layout, BATCH, SEQ).peak_memory_bytes
    assert memory_floor(model, candidate, parts, inflight) <= peak * (1 + 1e-9)
    assert layout_memory_floor(model, candidate, parts, inflight)(layout) <= peak * (1 + 1e-9)


@lru_cache(maxsize=1)
def _small_model() -> CostModel:
    return CostModel(resolve_model("llama3-8b"), Cluster.of(resolve_gpu("h100"), 64))


@lru_cache(maxsize=1)
def _small_candidates() -> list[Candidate]:
    """Every pipelined candidate of llama3-8b on 64 GPUs, ZeRO 0-3 (state sharding differs)."""
    model = _small_model()
    space = SearchSpace(zero=(0, 1, 2, 3))
    return [c for c in candidates(model.spec, model.cluster, BATCH, SEQ, space) if c.pp > 1]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_layout_step_bound_with_dp_and_tail_never_exceeds_the_predicted_step(data):
    """The search's per-layout bound (chain bound with each rank's exposed DP communication,
    plus the loss-scale check, gradient norm and Adam step) is at most `predict`'s step."""
    from planner.predict import chunk_costs
    from planner.search.search import _bound, _LayoutBounds

    model = _small_model()
    _, layout = _draw_layout(data, model)
    step = predict(model, layout, BATCH, SEQ).step_time_s
    assert _bound(model, layout, chunk_costs(model, layout, SEQ)) <= step * (1 + 1e-9)
    assert _LayoutBounds(model, layout, chunk_costs(model, layout, SEQ)).sequencing() <= step


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_layout_sequencing_bound_with_dp_and_tail_never_exceeds_the_predicted_step(data):
    """The search's bound before it simulates a layout that fits: at most `predict`'s step
    (its rounding margin taken, no tolerance)."""
    from planner.predict import chunk_costs
    from planner.search.search import _LayoutBounds

    model = _small_model()
    _, layout = _draw_layout(data, model)
    step = predict(model, layout, BATCH, SEQ).step_time_s
    bounds = _LayoutBounds(model, layout, chunk_costs(model, layout, SEQ))
    assert bounds.chain() * (1 - 2e-9) <= bounds.sequencing() <= step


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_round_trip_floor_never_exceeds_the_predicted_step(data):
    """The floor that passes over a candidate: at most `predict`'s step of any of its layouts."""
    model = _small_model()
    candidate, layout = _draw_layout(data, model)
    step = predict(model, layout, BATCH, SEQ).step_time_s
    assert round_trip_floor(model, candidate, parts_of(model, candidate, SEQ)) <= step * (1 + 1e-9)


def _draw_layout(data, model: CostModel):
    """A candidate of `_small_candidates` and any layout of it (`draw_layout`)."""
    candidate = data.draw(st.sampled_from(_small_candidates()))
    return candidate, draw_layout(data, candidate, model.spec.num_layers)
