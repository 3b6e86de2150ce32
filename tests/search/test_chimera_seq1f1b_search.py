"""Chimera and Seq1F1B in the search: their memory against closed forms, their bounds against
the simulator, and the search against brute force over a small space that holds them."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_reference import assert_never_worse, even_cut_reference

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import memory
from planner.cost.model import CostModel
from planner.cost.segments import attention_share, segment_fractions, segment_layer_costs, segment_shard
from planner.cost.shapes import Shard
from planner.layout import Layout, even_stage_layers
from planner.pipeline import ChunkCosts
from planner.predict import chunk_costs, predict
from planner.schedule import StageCosts, compile_schedule, simulate
from planner.schedule.seq1f1b import causal_segment_scales, weighted_inflight
from planner.search.bounds import layout_bound
from planner.search.search import search
from planner.search.space import SearchSpace, candidates
from planner.spec import Cluster

SEQ = 4096


def _model(name="llama3-8b", gpus=8, limit=None):
    return CostModel(resolve_model(name), Cluster.of(resolve_gpu("h100"), gpus, memory_limit_gib=limit))


def _layout(schedule, pp, m, *, tp=1, dp=1, vpp=1, segments=1, mode="none", layers=32, zero=1):
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=1,
        num_microbatches=m,
        schedule=schedule,
        recompute=(mode,) * pp,
        zero_stage=zero,
        segments=segments,
        stage_layers=even_stage_layers(layers, pp, vpp, schedule),
    )


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_chimera_holds_the_state_of_two_stages_on_every_rank(pp):
    """Rank r runs model stage r down and stage P-1-r up: its weights, grads and optimizer
    state are two 1F1B ranks' (r and P-1-r), i.e. twice the layers', in closed form."""
    model = _model(gpus=8 * pp // 4 if pp > 4 else 8)
    dp = model.cluster.num_gpus // pp
    chim = predict(model, _layout("chimera", pp, 2 * pp, dp=dp, vpp=2), 2 * pp * dp, SEQ)
    one = predict(model, _layout("1f1b", pp, 2 * pp, dp=dp), 2 * pp * dp, SEQ)
    spec = model.spec
    state = memory.state_bytes_per_param(1, dp)
    per_layer = memory.transformer_param_count(spec, 1, 1, None)
    for r in range(pp):
        for part in ("weights", "grads", "optimizer"):
            twice = getattr(one.memory[r], part) + getattr(one.memory[pp - 1 - r], part)
            assert getattr(chim.memory[r], part) == pytest.approx(twice, rel=1e-12)
        layers = 2 * spec.num_layers // pp
        ends = (memory.embedding_param_count(spec, 1) + memory.head_param_count(spec, 1)) if r in (0, pp - 1) else 0
        assert chim.memory[r].weights == pytest.approx((layers * per_layer + ends) * state.weights, rel=1e-12)
    # and the replicas' gradient all-reduce is a per-step cost
    assert chim.time_breakdown_s["replica_grad_sync"] > 0
    assert sum(chim.time_breakdown_s.values()) == pytest.approx(chim.step_time_s, rel=1e-12)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_seq1f1b_holds_p_minus_r_plus_k_minus_1_segments_against_1f1bs_p_minus_r_microbatches(k):
    """Sun et al. 2024: rank r keeps (P - r) + (k - 1) segments in flight where 1F1B keeps
    P - r micro-batches. With segments of 1/k of the tokens that is ((P-r) + k-1) / (k (P-r))
    of 1F1B's activations (activations are linear in tokens with flash attention); the
    computation-wise partition makes the early segments longer, so the held ones weigh
    between that and the longest segment's share."""
    model, pp = _model(), 4
    one_layout, seg_layout = _layout("1f1b", pp, 8, dp=2), _layout("seq1f1b", pp, 8, dp=2, segments=k)
    one, seg = predict(model, one_layout, 16, SEQ), predict(model, seg_layout, 16, SEQ)
    one_extra = chunk_costs(model, one_layout, SEQ).extra_bytes
    seg_costs = chunk_costs(model, seg_layout, SEQ)
    fractions = segment_fractions(k, attention_share(model, Shard(mbs=1, seq=SEQ), "none", k))
    for r in range(pp):
        held_1f1b = one.memory[r].activations - one_extra[r]
        held = seg.memory[r].activations - seg_costs.extra_bytes[r]
        even = (pp - r + k - 1) / (k * (pp - r))
        assert even * held_1f1b * (1 - 1e-9) <= held <= even * k * max(fractions) * held_1f1b * (1 + 1e-9)
    assert weighted_inflight(pp, 8, (1 / k,) * k) == pytest.approx([min(8 * k, pp - r + k - 1) for r in range(pp)])
    assert seg.peak_memory_bytes < one.peak_memory_bytes


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("a", [0.0, 0.2, 0.5, 0.9])
def test_computation_wise_partition_gives_segments_of_equal_cost(k, a):
    """Segment j of [x_j, x_j+1) costs (1 - a)(x_j+1 - x_j) + a (x_j+1^2 - x_j^2) of the
    micro-batch (linear part plus causal attention over the prefix): 1/k each."""
    fractions = segment_fractions(k, a)
    assert sum(fractions) == pytest.approx(1.0)
    edges = [sum(fractions[:j]) for j in range(k + 1)]
    for j in range(k):
        cost = (1 - a) * (edges[j + 1] - edges[j]) + a * (edges[j + 1] ** 2 - edges[j] ** 2)
        assert cost == pytest.approx(1 / k, abs=1e-12)
    assert all(x >= y - 1e-15 for x, y in zip(fractions, fractions[1:]))  # earlier segments longer


def test_a_segment_costs_its_tokens_gemms_and_the_mean_causal_attention():
    """A segment's GEMM work is 1/k of the micro-batch's at a smaller shape (not faster per
    token beyond measurement noise); its attention, on average, 1/k of the whole sequence's
    causal attention, which an s/k-token sequence alone does only 1/k^2 of: the segments
    together cost at least the micro-batch, and more attention-bound layers (longer sequences)
    weigh more. The H100's measured GEMM table is not monotone in m within 2 % (4096^3 GEMMs:
    807.7 TFLOP/s as 2 x 4096 rows, 793.1 as 4 x 4096, planner/presets/gemm_h100_sxm_xla.toml)."""
    model = _model()
    shard = Shard(mbs=1, seq=32768)
    whole = model.layer_costs("transformer", shard)
    for k in (2, 4, 8):
        mean = segment_layer_costs(model, "transformer", shard, "none", False, k)
        alone = model.layer_costs("transformer", segment_shard(shard, k))
        assert mean.forward_s > alone.forward_s and mean.backward_input_s > alone.backward_input_s
        assert k * mean.forward_s >= whole.forward_s * (1 - 0.02)
        assert mean.activation_bytes * k == pytest.approx(whole.activation_bytes, rel=1e-9)
        share = attention_share(model, shard, "none", k)
        scales = causal_segment_scales(k, share)
        assert 0 < share < 1 and sum(scales) == pytest.approx(k) and scales[0] < 1 < scales[-1]
    assert attention_share(model, shard, "none", 4) > attention_share(model, Shard(mbs=1, seq=4096), "none", 4)


@st.composite
def _costs(draw, name):
    pp = draw(st.sampled_from([2, 4, 6]) if name == "chimera" else st.integers(2, 5))
    vpp = 2 if name == "chimera" else 1
    m = draw(st.integers(1, 6)) * 2 if name == "chimera" else draw(st.integers(1, 8))
    k = draw(st.sampled_from([2, 3, 4])) if name == "seq1f1b" else 1

    def table():
        return tuple(tuple(draw(st.floats(0.1, 3.0)) for _ in range(vpp)) for _ in range(pp))

    f, i, w = table(), table(), table()
    p2p = draw(st.floats(0.0, 0.5))
    after = [draw(st.floats(0.0, 5.0)) for _ in range(pp)]
    return pp, vpp, m, k, f, i, w, p2p, after


@pytest.mark.parametrize("name", ["chimera", "seq1f1b"])
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_layout_bound_never_exceeds_the_simulated_step(name, data):
    pp, vpp, m, k, f, i, w, p2p, after = data.draw(_costs(name))
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
    chimera = name == "chimera"
    assert layout_bound(costs, m, False, bidirectional=chimera) <= sim.step_time_s * (1 + 1e-9)
    ends = max(sim.step_time_s, *(sim.finish_s[r] + after[r] for r in range(pp)))
    assert layout_bound(costs, m, False, after, bidirectional=chimera) <= ends * (1 + 1e-9)


@pytest.mark.parametrize(
    ("schedules", "limit", "seq"),
    [
        (("chimera", "seq1f1b"), 40.0, 4096),
        (("chimera", "seq1f1b", "1f1b", "zbv"), 30.0, 8192),
    ],
)
def test_search_is_never_worse_than_brute_force(schedules, limit, seq):
    model = _model(gpus=16, limit=limit)
    space = SearchSpace(
        tp=(1, 2, 4),
        pp=(2, 4, 8),
        cp=(1,),
        mbs=(1, 2),
        schedules=schedules,
        segments=(2, 4),
        sequence_parallel=(True,),
        zero=(1,),
    )
    result = search(model, 64, seq, space, top=3)
    reference = even_cut_reference(model, 64, seq, space)
    assert result.plans and math.isfinite(reference)
    assert_never_worse(model, result, reference, 64, seq)


def test_seq1f1b_candidates_carry_segments_that_split_the_sequence():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    space = SearchSpace(pp=(4,), schedules=("seq1f1b", "chimera"), segments=(2, 3, 4, 8))
    seen = list(candidates(spec, cluster, 256, 32768, space))
    segments = {(c.cp, c.segments) for c in seen if c.schedule == "seq1f1b"}
    assert {k for _, k in segments} == {2, 4, 8}  # 3 does not divide 32768
    assert all(32768 % (k * 2 * cp) == 0 for cp, k in segments if cp > 1)
    assert all(c.segments == 1 and c.num_microbatches % 2 == 0 and c.vpp == 2 for c in seen if c.schedule == "chimera")
    default = {c.schedule for c in candidates(spec, cluster, 256, 4096, SearchSpace(pp=(4,)))}
    assert not default & {"chimera", "seq1f1b"}  # named only
