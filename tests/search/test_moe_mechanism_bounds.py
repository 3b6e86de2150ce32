"""The search's floors and bounds stay lower bounds of `predict` when the plans are priced with
DeepEP's dispatcher and Megatron's combined-1F1B all-to-all overlap (--moe-dispatcher,
--moe-ep-overlap): the candidate's floors take the paired (least) per-layer costs wherever
predict may pair a layout's layers, predict blends in the warm-up passes that run alone."""

from __future__ import annotations

from functools import cache, lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_reference import draw_layout

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.layout import stage_layers_from_counts
from planner.predict import chunk_costs, pairs_moe_comm, predict
from planner.search.costing import (
    candidate_pairing,
    inflight_of,
    layout_memory_floor,
    layout_of,
    memory_floor,
    parts_of,
    round_trip_floor,
    step_floor,
)
from planner.search.search import _bound, _LayoutBounds, search
from planner.search.space import SearchSpace, candidates
from planner.spec import Cluster

SEQ, BATCH, GPUS = 4096, 512, 64
MECHANISMS = [(d, o) for d in ("alltoall", "deepep") for o in (False, True)]


@cache
def _model(dispatcher: str, overlap: bool) -> CostModel:
    """Qwen3-30B-A3B (128 experts, top-8) on 8 nodes of 8 H100s: EP up to 64, across nodes."""
    options = CostOptions.of(moe_dispatcher=dispatcher, moe_ep_overlap=overlap)
    return CostModel(resolve_model("qwen3-30b-a3b"), Cluster.of(resolve_gpu("h100"), GPUS), options)


@lru_cache(maxsize=1)
def _moe_candidates() -> list:
    """Candidates with expert parallelism, without a pipeline or with 1F1B / interleaved 1F1B /
    DualPipeV (the schedules whose pairing the options change), ZeRO 1."""
    model = _model("alltoall", False)
    space = SearchSpace(schedules=("1f1b", "interleaved_1f1b", "dualpipev"), pp=(1, 2, 4), mbs=(1, 2))
    return [c for c in candidates(model.spec, model.cluster, BATCH, SEQ, space) if c.ep > 1]


def _draw(data):
    dispatcher, overlap = data.draw(st.sampled_from(MECHANISMS))
    model = _model(dispatcher, overlap)
    candidate = data.draw(st.sampled_from(_moe_candidates()))
    layout = draw_layout(data, candidate, model.spec.num_layers)
    return model, candidate, layout


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_floors_and_bounds_never_exceed_the_predicted_step_and_memory(data):
    model, candidate, layout = _draw(data)
    prediction = predict(model, layout, BATCH, SEQ)
    step, peak = prediction.step_time_s, prediction.peak_memory_bytes
    parts = parts_of(model, candidate, SEQ)
    inflight = inflight_of(candidate)
    assert step_floor(model, candidate, parts) <= step * (1 + 1e-9)
    if len(set(layout.recompute)) == 1:  # the floor of layouts running one mode everywhere
        mode = candidate.modes.index(layout.recompute[0])
        assert step_floor(model, candidate, parts, mode) <= step * (1 + 1e-9)
    assert round_trip_floor(model, candidate, parts) <= step * (1 + 1e-9)
    costs = chunk_costs(model, layout, SEQ)
    assert _bound(model, layout, costs) <= step * (1 + 1e-9)
    assert _LayoutBounds(model, layout, costs).sequencing() <= step
    assert memory_floor(model, candidate, parts, inflight) <= peak * (1 + 1e-9)
    assert layout_memory_floor(model, candidate, parts, inflight)(layout) <= peak * (1 + 1e-9)


def _interleaved(model: CostModel):
    return next(
        c
        for c in _moe_candidates()
        if c.schedule == "interleaved_1f1b" and c.ep == 32 and c.modes == ("none", "selective", "full")
    )


def test_the_candidate_floors_price_the_overlap_where_predict_does():
    """Not vacuous: with the overlap on, an interleaved candidate's blocks are costed paired
    (less exposed all-to-all than with it off) but for `full`, which Megatron refuses with it;
    a layout of it without full recompute is paired by predict, one with it is not."""
    on, off = _model("deepep", True), _model("deepep", False)
    candidate = _interleaved(on)
    assert candidate_pairing(on, candidate) is True and candidate_pairing(off, candidate) is False
    paired, alone = parts_of(on, candidate, SEQ), parts_of(off, candidate, SEQ)
    for mode, (p, a) in zip(candidate.modes, zip(paired.blocks, alone.blocks)):
        if mode == "full":
            assert p == a
        else:
            assert 0 < p.moe_comm_s < a.moe_comm_s
    layers = on.spec.num_layers
    counts = [layers // (candidate.pp * candidate.vpp)] * (candidate.pp * candidate.vpp)
    stages = stage_layers_from_counts(counts, layers, candidate.pp, candidate.vpp, candidate.schedule)
    assert pairs_moe_comm(on, layout_of(candidate, stages, ("selective",) * candidate.pp)) is True
    assert pairs_moe_comm(on, layout_of(candidate, stages, ("full",) * candidate.pp)) is False


@pytest.mark.parametrize("dispatcher,overlap", MECHANISMS)
def test_the_search_returns_the_best_of_the_even_cut_layouts_it_prices(dispatcher, overlap):
    """Over a small space (EP 8 / 16, interleaved 1F1B on PP 2, V 2), the search's best is no
    slower than `predict` of every even-cut layout of it in every recompute mode: its floors
    pruned nothing that would have won."""
    model = _model(dispatcher, overlap)
    space = SearchSpace(
        tp=(1,),
        pp=(2,),
        vpp=(2,),
        mbs=(1,),
        schedules=("interleaved_1f1b",),
        ep=(8, 16),
        etp=(1,),
        per_rank_recompute=False,
    )
    best = search(model, BATCH, SEQ, space, top=1).plans[0].prediction.step_time_s
    limit = model.cluster.memory_limit_bytes
    layers = model.spec.num_layers
    brute = []
    for candidate in candidates(model.spec, model.cluster, BATCH, SEQ, space):
        counts = [layers // 4] * 4
        stages = stage_layers_from_counts(counts, layers, 2, 2, "interleaved_1f1b")
        for mode in candidate.modes:
            prediction = predict(model, layout_of(candidate, stages, (mode,) * 2), BATCH, SEQ)
            if prediction.peak_memory_bytes <= limit:
                brute.append(prediction.step_time_s)
    assert brute and best <= min(brute) * (1 + 1e-9)


def test_dense_model_plans_are_unchanged_by_the_moe_options():
    """A dense model: the MoE options are accepted and change no cost and no search answer."""
    spec, cluster = resolve_model("llama3-8b"), Cluster.of(resolve_gpu("h100"), 16)
    plain = CostModel(spec, cluster)
    both = CostModel(spec, cluster, CostOptions.of(moe_dispatcher="deepep", moe_ep_overlap=True))
    space = SearchSpace(pp=(1, 2), schedules=("1f1b", "interleaved_1f1b"), mbs=(1,))
    a = search(plain, 32, 2048, space, top=3).plans
    b = search(both, 32, 2048, space, top=3).plans
    assert [f.layout for f in a] == [f.layout for f in b]
    assert [f.prediction.step_time_s for f in a] == [f.prediction.step_time_s for f in b]
