"""Chimera and Seq1F1B with what main costs since they were added: an MoE model's dense-MLP
layers and multi-token-prediction modules (costed per kind), routed experts' state over EDP,
Megatron's blocking pipeline p2p. Checked against 1F1B's stages (each of Chimera's chunks
runs one), closed forms, the simulator's send count, and brute force."""

import math

import pytest
from search_reference import assert_never_worse, even_cut_reference

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import DENSE_BLOCK, CostModel, CostOptions
from planner.cost.segments import segment_layer_costs, segment_shard
from planner.cost.shapes import Shard
from planner.layout import Layout, even_stage_layers
from planner.predict import chunk_costs, predict
from planner.search.search import search
from planner.search.space import SearchSpace
from planner.spec import Cluster

SEQ = 1024
SPEC = resolve_model("tiny-moe").model_copy(update={"mtp_depth": 1})  # one dense layer, 5 MoE, MTP


def _model(gpus, limit=None, **options):
    return CostModel(SPEC, Cluster.of(resolve_gpu("h100"), gpus, memory_limit_gib=limit), CostOptions.of(**options))


def _layout(schedule, pp, m, *, vpp=1, segments=1, dp=4, ep=2, zero=1):
    return Layout(
        tp=1,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=1,
        num_microbatches=m,
        schedule=schedule,
        recompute=("none",) * pp,
        zero_stage=zero,
        ep=ep,
        etp=1,
        segments=segments,
        stage_layers=even_stage_layers(SPEC.num_layers, pp, vpp, schedule),
    )


@pytest.mark.parametrize("pp", [2, 6])
def test_each_chimera_chunk_costs_the_1f1b_stage_it_runs(pp):
    """Rank r runs model stage r down (chunk 0) and stage P-1-r up (chunk 1): each chunk's
    times and parameters are those 1F1B's rank of that stage has (the embedding with stage 0,
    the head and the MTP module with stage P-1, dense layer 0 costed as dense), and the
    rank's routed experts are those of both stages."""
    model = _model(4 * pp)
    chim = chunk_costs(model, _layout("chimera", pp, 2 * pp, vpp=2), SEQ)
    one = chunk_costs(model, _layout("1f1b", pp, 2 * pp), SEQ)
    for r in range(pp):
        for chunk, stage in ((0, r), (1, pp - 1 - r)):
            for table in ("forward_s", "backward_input_s", "backward_weight_s", "activation_bytes", "chunk_params"):
                assert getattr(chim, table)[r][chunk] == pytest.approx(getattr(one, table)[stage][0], rel=1e-12)
        assert sum(chim.chunk_params[r]) == pytest.approx(chim.params[r], rel=1e-12)
        assert chim.expert_params[r] == pytest.approx(one.expert_params[r] + one.expert_params[pp - 1 - r], rel=1e-12)
    assert one.forward_s[0][0] != one.forward_s[pp - 1][0]  # the stages differ: the check has teeth


@pytest.mark.parametrize("zero", [0, 1])
def test_chimera_state_of_an_moe_model_is_two_1f1b_ranks_and_the_breakdown_adds_up(zero):
    pp, dp = 2, 4
    model = _model(pp * dp)
    chim = predict(model, _layout("chimera", pp, 2 * pp, vpp=2, zero=zero), 2 * pp * dp, SEQ)
    one = predict(model, _layout("1f1b", pp, 2 * pp, zero=zero), 2 * pp * dp, SEQ)
    for r in range(pp):
        for part in ("weights", "grads", "optimizer"):
            twice = getattr(one.memory[r], part) + getattr(one.memory[pp - 1 - r], part)
            assert getattr(chim.memory[r], part) == pytest.approx(twice, rel=1e-12)
    breakdown = chim.time_breakdown_s
    assert breakdown["replica_grad_sync"] > 0 and breakdown["moe_all_to_all"] > 0
    assert sum(breakdown.values()) == pytest.approx(chim.step_time_s, rel=1e-12)


@pytest.mark.parametrize("k", [2, 4])
def test_every_block_kind_pays_the_mean_causal_attention_per_segment(k):
    """The dense-MLP block has the MoE block's attention, so the same extra over an
    s/k-token sequence alone; the MTP module (one block each) pays it once per depth; the
    embedding and the head have no attention."""
    model = _model(8)
    shard = Shard(mbs=1, seq=SEQ, ep=2, etp=1)
    part = segment_shard(shard, k)

    def extra(kind):
        mean, alone = segment_layer_costs(model, kind, shard, "none", False, k), model.layer_costs(kind, part)
        return mean.forward_s - alone.forward_s, mean.backward_input_s - alone.backward_input_s

    moe = extra("transformer")
    assert moe[0] > 0 and moe[1] > 0
    assert extra(DENSE_BLOCK) == pytest.approx(moe, rel=1e-12)
    assert extra("mtp") == pytest.approx(tuple(SPEC.mtp_depth * x for x in moe), rel=1e-12)
    assert extra("embedding") == extra("head") == (0.0, 0.0)
    whole = model.layer_costs(DENSE_BLOCK, shard)
    assert k * segment_layer_costs(model, DENSE_BLOCK, shard, "none", False, k).forward_s >= whole.forward_s


@pytest.mark.parametrize("k", [2, 4])
def test_seq1f1b_blocking_sends_hold_each_segment(k):
    """Megatron's blocking p2p under seq1f1b: rank 0 sends every segment's activation forward
    and nothing back, so it is held M x k times the hold of one segment's (smaller) message;
    the breakdown still adds up to the step."""
    pp, m = 2, 4
    model = _model(8, p2p_mode="blocking")
    seg = _layout("seq1f1b", pp, m, segments=k)
    costs, whole = chunk_costs(model, seg, SEQ), chunk_costs(model, _layout("1f1b", pp, m), SEQ)
    assert whole.send_hold_forward_s / k < costs.send_hold_forward_s < whole.send_hold_forward_s
    p = predict(model, seg, m * 4, SEQ)
    assert p.timing.blocked_s[0] == pytest.approx(m * k * costs.send_hold_forward_s, rel=1e-12)
    assert p.time_breakdown_s["pp_p2p_blocked"] > 0
    assert sum(p.time_breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-12)


@pytest.mark.parametrize("limit", [80.0, 1.3, 1.25])
@pytest.mark.parametrize("p2p_mode", ["overlapped", "blocking"])
def test_search_with_chimera_and_seq1f1b_on_an_moe_model_is_never_worse_than_brute_force(limit, p2p_mode):
    """The floors and bounds (two layer kinds, MTP, replicas, segments) prune nothing better
    than what even cuts reach."""
    model = _model(16, limit, p2p_mode=p2p_mode)
    space = SearchSpace(
        tp=(1, 2),
        pp=(2,),
        cp=(1,),
        mbs=(1, 2),
        schedules=("chimera", "seq1f1b", "1f1b"),
        segments=(2, 4),
        sequence_parallel=(True,),
        zero=(1,),
        ep=(1, 2, 4),
        etp=(1,),
    )
    result = search(model, 64, SEQ, space, top=3)
    reference = even_cut_reference(model, 64, SEQ, space)
    assert result.plans and math.isfinite(reference)
    assert_never_worse(model, result, reference, 64, SEQ)
