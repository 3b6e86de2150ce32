"""DeepSeek-V3's layers costed as what they are: its 3 dense-MLP blocks, 58 MoE blocks and
the multi-token-prediction module on the last stage. The references are hand sums of the
cost model's per-layer costs and brute force over every cut, written here without the
search's or `predict`'s code."""

from __future__ import annotations

import itertools
import math

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import DENSE_BLOCK, CostModel
from planner.cost.shapes import Shard
from planner.layout import Layout
from planner.predict import chunk_costs, predict
from planner.search.costing import inflight_of, parts_of, rank_costs, solved_layout, total_s
from planner.search.partition import exact_cuts
from planner.search.space import SearchSpace, candidates
from planner.spec import Cluster

SEQ = 4096


@pytest.fixture(scope="module")
def model():
    spec = resolve_model("deepseek-v3")
    return CostModel(spec, Cluster.of(resolve_gpu("h100"), 256, memory_limit_gib=100_000))


def shard(**kw):
    return Shard(mbs=1, seq=SEQ, tp=8, sequence_parallel=True, ep=32, etp=1, **kw)


def test_dense_block_differs_from_the_moe_block_by_its_mlp(model):
    """Per GPU, at TP 8 and EP 32: the dense MLP (3 h f / 8) in place of the router (h E),
    the shared expert (3 h f_e / 8) and 256 / 32 routed experts (3 h f_e each)."""
    h, f, fe = 7168, 18432, 2048
    dense = model.layer_costs(DENSE_BLOCK, shard())
    moe = model.layer_costs("transformer", shard())
    assert dense.param_count - moe.param_count == pytest.approx(
        3 * h * f / 8 - (h * 256 + 3 * h * fe / 8 + 8 * 3 * h * fe)
    )
    assert dense.expert_param_count == 0 and moe.expert_param_count == 8 * 3 * h * fe
    assert dense.moe_comm_s == 0 < moe.moe_comm_s
    # a dense block has no all-to-all, and its MLP is ~2.2x narrower than top-8 + shared x 2048
    assert dense.comm_forward_s < moe.comm_forward_s and dense.forward_s < moe.forward_s


def layout(pp, cuts):
    bounds = list(itertools.accumulate(cuts, initial=0))
    return Layout(
        tp=8,
        pp=pp,
        dp=256 // (8 * pp),
        cp=1,
        vpp=1,
        mbs=1,
        num_microbatches=16,
        schedule="1f1b",
        recompute=("full",) * pp,
        sequence_parallel=True,
        zero_stage=1,
        stage_layers=tuple(((a, b),) for a, b in zip(bounds, bounds[1:])),
        ep=32,
        etp=1,
    )


def test_chunk_costs_are_hand_sums_of_each_layer_kind(model):
    lay = layout(4, (16, 15, 15, 15))
    costs = chunk_costs(model, lay, SEQ)
    s = shard()
    dense, moe = (model.layer_costs(k, s, "full") for k in (DENSE_BLOCK, "transformer"))
    embedding, head, mtp = (model.layer_costs(k, s, "full") for k in ("embedding", "head", "mtp"))

    def fwd(c):
        return c.forward_s + c.comm_forward_s

    assert costs.forward_s[0][0] == pytest.approx(3 * fwd(dense) + 13 * fwd(moe) + fwd(embedding), rel=1e-12)
    assert costs.forward_s[1][0] == pytest.approx(15 * fwd(moe), rel=1e-12)
    assert costs.forward_s[3][0] == pytest.approx(15 * fwd(moe) + fwd(head) + fwd(mtp), rel=1e-12)
    assert costs.params[0] == pytest.approx(3 * dense.param_count + 13 * moe.param_count + embedding.param_count)
    # the last stage holds the MTP module: its block, the 2h -> h projection, norms and an embedding copy
    h = 7168
    mtp_params = moe.param_count + 2 * h * h / 8 + 2 * h + embedding.param_count
    assert costs.params[3] == pytest.approx(15 * moe.param_count + head.param_count + mtp_params)
    assert costs.expert_params[1] == pytest.approx(15 * moe.expert_param_count)
    assert costs.expert_params[3] == pytest.approx(16 * moe.expert_param_count)
    # MTP's time: its block, the shared head again, the embedding lookup and the projection
    assert fwd(mtp) > fwd(moe) + fwd(head)
    p = predict(model, lay, 256, SEQ)
    assert p.memory[3].weights > p.memory[1].weights


def brute_force_bottleneck(model, pp):
    """Least over every cut of max over ranks of (embedding | head + MTP) + the sum of each
    layer's own cost, all in full recompute."""
    s = shard()
    per_layer = [
        total_s(model.layer_costs("transformer" if model.spec.is_moe_layer(i) else DENSE_BLOCK, s, "full"))
        for i in range(61)
    ]
    prefix = list(itertools.accumulate(per_layer, initial=0.0))
    first = total_s(model.layer_costs("embedding", s))
    last = total_s(model.layer_costs("head", s)) + total_s(model.layer_costs("mtp", s, "full"))
    best = math.inf
    for cut in itertools.combinations(range(1, 61), pp - 1):
        bounds = (0, *cut, 61)
        worst = max(
            prefix[b] - prefix[a] + (first if r == 0 else 0) + (last if r == pp - 1 else 0)
            for r, (a, b) in enumerate(zip(bounds, bounds[1:]))
        )
        best = min(best, worst)
    return best


def test_search_cuts_shift_to_the_stage_holding_the_dense_layers(model):
    space = SearchSpace(
        tp=(8,),
        pp=(4,),
        cp=(1,),
        vpp=(1,),
        mbs=(1,),
        schedules=("1f1b",),
        recompute=("full",),
        sequence_parallel=(True,),
        ep=(32,),
        etp=(1,),
    )
    candidate = next(c for c in candidates(model.spec, model.cluster, 256, SEQ, space))
    parts = parts_of(model, candidate, SEQ)
    costs = rank_costs(model, candidate, parts, inflight_of(candidate), model.cluster.memory_limit_bytes)
    assert costs.layer_kinds.count(1) == 3 and costs.layer_kinds[:3] == (1, 1, 1)
    cuts = exact_cuts(costs, 61)
    assert cuts is not None
    assert cuts.bottleneck_s == pytest.approx(brute_force_bottleneck(model, 4), rel=1e-9)
    # the first stage runs the cheap dense layers, so it takes more layers than the others;
    # the last one, with the head and the MTP module, fewer
    assert cuts.layers[0] > max(cuts.layers[1:3]) and cuts.layers[3] < min(cuts.layers[1:3])
    lay = solved_layout(candidate, cuts, 61)
    assert lay.stage_layers[0] == ((0, cuts.layers[0]),)


def test_a_layer_frequency_pattern_is_costed_layer_by_layer():
    """Qwen's decoder_sparse_step 2: layers 1, 3, 5 are MoE, 0, 2, 4 dense. Rank 0 runs two
    dense blocks and one MoE block, rank 1 the other way round: hand sums."""
    spec = resolve_model("tiny-moe").model_copy(update={"first_dense_layers": 0, "moe_layer_freq": 2})
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 8))
    assert model.block_kinds == (DENSE_BLOCK, "transformer") * 3
    lay = Layout(
        tp=1,
        pp=2,
        dp=4,
        cp=1,
        vpp=1,
        mbs=1,
        num_microbatches=4,
        schedule="1f1b",
        recompute=("none", "none"),
        sequence_parallel=False,
        zero_stage=1,
        stage_layers=(((0, 3),), ((3, 6),)),
        ep=2,
        etp=1,
    )
    costs = chunk_costs(model, lay, 1024)
    s = Shard(mbs=1, seq=1024, ep=2, etp=1)
    dense, moe, embedding, head = (model.layer_costs(k, s) for k in (DENSE_BLOCK, "transformer", "embedding", "head"))

    def fwd(c):
        return c.forward_s + c.comm_forward_s

    assert costs.forward_s[0][0] == pytest.approx(2 * fwd(dense) + fwd(moe) + fwd(embedding), rel=1e-12)
    assert costs.forward_s[1][0] == pytest.approx(fwd(dense) + 2 * fwd(moe) + fwd(head), rel=1e-12)
    assert costs.activation_bytes[1][0] == pytest.approx(
        dense.activation_bytes + 2 * moe.activation_bytes + head.activation_bytes
    )
    assert costs.expert_params == [pytest.approx(moe.expert_param_count), pytest.approx(2 * moe.expert_param_count)]
