"""Expert parallelism in the search: the plan is never worse than brute-force `predict` over a
small MoE space (every EP x ETP folding enumerated here without the search's code), and a dense
model's space is unchanged by the expert dimensions."""

from __future__ import annotations

import math

import pytest
from search_reference import assert_never_worse, pipeline_schedules

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel
from planner.layout import Layout, even_stage_layers
from planner.predict import predict
from planner.search.search import search
from planner.search.space import DEFAULT_SCHEDULES, SearchSpace, candidates
from planner.spec import Cluster


def brute_force(model: CostModel, global_batch: int, seq: int, space: SearchSpace) -> tuple[float, Layout | None]:
    """Least predicted step time over the space with even cuts and one recompute mode, every
    (ep, etp) where EP divides the experts, ETP the expert FFN and EP x ETP the TP x DP ranks."""
    spec, cluster = model.spec, model.cluster
    n, best, arg = cluster.num_gpus, math.inf, None
    for tp in space.tp:
        for pp in space.pp:
            if n % (tp * pp):
                continue
            dp = n // (tp * pp)
            for ep in space.ep:
                for etp in space.etp:
                    if spec.num_experts % ep or spec.expert_ffn_hidden_size % etp or (tp * dp) % (ep * etp):
                        continue
                    for mbs in space.mbs:
                        if global_batch % (dp * mbs):
                            continue
                        m = global_batch // (dp * mbs)
                        for name, vpp in pipeline_schedules(space, pp, m, spec.num_layers):
                            for mode in space.recompute:
                                layout = Layout(
                                    tp=tp,
                                    pp=pp,
                                    dp=dp,
                                    cp=1,
                                    vpp=vpp,
                                    mbs=mbs,
                                    num_microbatches=m,
                                    schedule=name,
                                    recompute=(mode,) * pp,
                                    sequence_parallel=tp > 1,
                                    zero_stage=1,
                                    stage_layers=even_stage_layers(spec.num_layers, pp, vpp, name),
                                    ep=ep,
                                    etp=etp,
                                )
                                p = predict(model, layout, global_batch, seq)
                                if p.peak_memory_bytes <= cluster.memory_limit_bytes and p.step_time_s < best:
                                    best, arg = p.step_time_s, layout
    return best, arg


@pytest.mark.parametrize("limit", [80.0, 3.0])
def test_moe_search_is_never_worse_than_brute_force(limit):
    spec = resolve_model("tiny-moe")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 16, memory_limit_gib=limit))
    space = SearchSpace(
        tp=(1, 2),
        pp=(1, 2),
        cp=(1,),
        vpp=(1, 2),
        mbs=(1, 2, 4),
        schedules=DEFAULT_SCHEDULES,
        sequence_parallel=(True,),
        zero=(1,),
        ep=(1, 2, 4, 8),
        etp=(1, 2),
        recompute=("none", "full"),
    )
    result = search(model, 64, 1024, space, top=3)
    reference, layout = brute_force(model, 64, 1024, space)
    assert layout is not None and result.plans
    assert_never_worse(model, result, reference, 64, 1024)


def test_expert_parallel_plan_reports_its_all_to_all():
    spec = resolve_model("tiny-moe")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 16))
    result = search(model, 64, 1024, SearchSpace(tp=(1,), pp=(1,), ep=(8,), etp=(1,)), top=1)
    p = result.plans[0].prediction
    assert result.plans[0].layout.ep == 8
    assert p.time_breakdown_s["moe_all_to_all"] > 0
    assert sum(p.time_breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-9)


def test_dense_model_has_one_expert_shape():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 32)
    found = list(candidates(spec, cluster, 64, 4096, SearchSpace(pp=(1, 2))))
    assert found and all(c.ep == 1 and c.etp is None for c in found)
    assert len(found) == len(set(found))


def test_expert_shapes_fold_over_the_ranks():
    spec = resolve_model("qwen3-30b-a3b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    found = {(c.tp, c.cp, c.dp, c.ep, c.etp) for c in candidates(spec, cluster, 256, 4096, SearchSpace(pp=(1,)))}
    assert all(128 % ep == 0 and (tp * cp * dp) % (ep * etp) == 0 for tp, cp, dp, ep, etp in found)
    assert {ep for *_, ep, _ in found} == {1, 2, 4, 8, 16, 32, 64}
    assert (8, 1, 8, 64, 1) in found and (8, 1, 8, 8, 8) in found


def test_explain_names_ep_etp_and_the_all_to_all_a_schedule_cannot_hide():
    from planner.search.explain import alternatives

    spec = resolve_model("mixtral-8x7b")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 64))
    space = SearchSpace(tp=(2,), pp=(8,), mbs=(2,), schedules=("dualpipev", "zbv"), ep=(1, 2), etp=(1, 2))
    best = search(model, 256, 4096, space, top=1).plans[0]
    assert best.layout.schedule == "dualpipev"
    changes = {a.change: a for a in alternatives(model, best, 256, 4096, space)}
    assert {"ep 2", "schedule zbv"} <= set(changes)
    assert changes["schedule zbv"].found.layout.schedule == "zbv"
    zbv = changes["schedule zbv"].found.prediction.time_breakdown_s["moe_all_to_all"]
    assert zbv > best.prediction.time_breakdown_s["moe_all_to_all"]
