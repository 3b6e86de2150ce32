"""`search` against brute force: every layout of the space with even cuts, predicted one by one
exactly as `planner evaluate` does, the best that fits kept."""

from __future__ import annotations

import math

import pytest
from search_reference import assert_never_worse, pipeline_schedules

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel
from planner.layout import Layout, check_layout, even_stage_layers
from planner.predict import predict
from planner.schedule import SCHEDULES
from planner.search.search import search
from planner.search.space import SearchSpace, candidates
from planner.spec import Cluster

GiB = 2**30


def brute_force(model: CostModel, global_batch: int, seq: int, space: SearchSpace) -> float:
    """Least predicted step time over the space's layouts with even cuts and one recompute
    mode everywhere, enumerated without the search's code (degrees, batching, schedules)."""
    spec, cluster = model.spec, model.cluster
    n, best = cluster.num_gpus, math.inf
    for tp in space.tp:
        for pp in space.pp:
            for cp in space.cp:
                if n % (tp * pp * cp):
                    continue
                dp = n // (tp * pp * cp)
                for mbs in space.mbs:
                    if global_batch % (dp * mbs):
                        continue
                    m = global_batch // (dp * mbs)
                    for name, vpp in pipeline_schedules(space, pp, m, spec.num_layers):
                        for sp in {v and tp > 1 for v in space.sequence_parallel}:
                            for zero in space.zero:
                                for mode in space.recompute:
                                    layout = Layout(
                                        tp=tp,
                                        pp=pp,
                                        dp=dp,
                                        cp=cp,
                                        vpp=vpp,
                                        mbs=mbs,
                                        num_microbatches=m,
                                        schedule=name,
                                        recompute=(mode,) * pp,
                                        sequence_parallel=sp,
                                        zero_stage=zero,
                                        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, name),
                                    )
                                    check_layout(layout, spec, cluster, global_batch, seq)
                                    p = predict(model, layout, global_batch, seq)
                                    if p.peak_memory_bytes <= cluster.memory_limit_bytes:
                                        best = min(best, p.step_time_s)
    return best


CASES = [
    # model, GPUs, memory limit GiB, global batch, seq
    ("llama3-8b", 16, 40.0, 64, 4096),
    ("llama3-8b", 8, 24.0, 32, 4096),
    ("llama3-70b", 64, 80.0, 128, 4096),
]


@pytest.mark.parametrize(("name", "gpus", "limit", "batch", "seq"), CASES)
def test_search_is_never_worse_than_brute_force(name, gpus, limit, batch, seq):
    spec = resolve_model(name)
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), gpus, memory_limit_gib=limit))
    space = SearchSpace(
        tp=(1, 2, 4, 8),
        pp=(1, 2, 4, 8),
        cp=(1,),
        vpp=(1, 2, 3, 4),
        mbs=(1, 2, 4),
        schedules=tuple(n for n, i in SCHEDULES.items() if i.searched_by_default),
        sequence_parallel=(True, False),
        zero=(1,),
    )
    result = search(model, batch, seq, space, top=3)
    reference = brute_force(model, batch, seq, space)
    assert result.plans, "brute force found a plan, the search did not"
    # no worse than brute force, and the answer is what evaluate predicts for it, and it fits
    assert_never_worse(model, result, reference, batch, seq)
    times = [f.prediction.step_time_s for f in result.plans]
    assert times == sorted(times) and len({f.layout for f in result.plans}) == len(times)


def test_candidates_cover_every_factorisation():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 32)
    found = {(c.tp, c.pp, c.dp, c.cp) for c in candidates(spec, cluster, 256, 4096, SearchSpace())}
    expected = {
        (tp, pp, 32 // (tp * pp), 1) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8, 16, 32) if 32 % (tp * pp) == 0
    }
    assert found == expected  # tp stays within the 8-GPU node; cp only for long sequences


def test_restrictions_hold():
    spec = resolve_model("llama3-70b")
    cluster = Cluster.of(resolve_gpu("h100"), 256)
    space = SearchSpace(
        tp=(8,), pp=(4, 8), schedules=("1f1b", "zb_h1"), mbs=(1,), recompute=("full",), per_rank_recompute=False
    )
    seen = list(candidates(spec, cluster, 512, 8192, space))
    assert seen
    for c in seen:
        assert c.tp == 8 and c.pp in (4, 8) and c.schedule in ("1f1b", "zb_h1") and c.mbs == 1
        assert c.modes == ("full",) and c.dp * c.mbs * c.num_microbatches == 512


def test_long_sequences_try_context_parallelism():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 64)
    cps = {c.cp for c in candidates(spec, cluster, 64, 65536, SearchSpace(mbs=(1,)))}
    assert cps >= {1, 2, 4, 8}


def test_memory_limit_binds():
    """With less memory the best plan is slower or needs recompute, never over the limit."""
    spec = resolve_model("llama3-8b")
    roomy = search(CostModel(spec, Cluster.of(resolve_gpu("h100"), 8)), 64, 4096, top=1).plans[0]
    tight_model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 8, memory_limit_gib=24))
    tight = search(tight_model, 64, 4096, top=1).plans[0]
    assert tight.prediction.peak_memory_bytes <= 24 * GiB
    assert tight.prediction.step_time_s >= roomy.prediction.step_time_s


def test_nothing_fits():
    spec = resolve_model("llama3-70b")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 8, memory_limit_gib=16))
    result = search(model, 64, 4096)
    assert result.plans == []
    assert result.smallest_need_bytes > 16 * GiB
