"""Data-parallel exposure under Megatron's interleaved 1F1B, model chunk by model chunk
(`predict.interleaved_dp_exposed`).

The closed form takes each chunk's window from the chunk costs (no bubbles). Reference: the
same launch rules (megatron/core/pipeline_parallel/schedules.py, `align_grad_reduce` and
`align_param_gather`) applied to the simulator's own timeline, whose bubbles only widen the
windows: the closed form is never below it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import step
from planner.cost.model import CostModel, CostOptions
from planner.layout import Layout, even_stage_layers
from planner.pipeline import pipeline_timing
from planner.predict import chunk_costs, exposed_dp_times, interleaved_dp_exposed
from planner.schedule import rank_stages
from planner.schedule.actions import B, F
from planner.spec import Cluster

SEQ = 4096


def _case(pp, vpp, m, dp, *, zero=1, name="llama3-70b", schedule="interleaved_1f1b"):
    spec = resolve_model(name)
    layout = Layout(
        tp=8,
        pp=pp,
        dp=dp,
        vpp=vpp,
        mbs=1,
        num_microbatches=m,
        schedule=schedule,
        recompute=("none",) * pp,
        sequence_parallel=True,
        zero_stage=zero,
        stage_layers=even_stage_layers(spec.num_layers, pp, vpp, schedule),
    )
    cluster = Cluster.of(resolve_gpu("h100"), 8 * pp * dp)
    return CostModel(spec, cluster, CostOptions.of(interference=False)), layout


def _chunk_comm(model, layout, costs, rank):
    shards, net, reduce, gather = layout.dp, model.network, [], []
    for params in costs.chunk_params[rank]:
        reduce.append(net.reduce_scatter(params * 4, shards, layout.tp))
        gather.append(net.all_gather(params * 2, shards, layout.tp))
    return reduce, gather


def _timeline_exposure(model, layout, costs, rank):
    """Megatron's launch rules on the simulated timeline of `rank` (one collective call per
    chunk: ranks > 0 under ZeRO-1 bucket nothing)."""
    timing = pipeline_timing(costs, layout.schedule, layout.pp, layout.vpp, layout.num_microbatches, timeline=True)
    chunk_of = {s: c for c, s in enumerate(rank_stages(rank, layout.pp, layout.vpp))}
    mine = sorted((e for e in timing.timeline if e.rank == rank), key=lambda e: e.start_s)
    backward = [e for e in mine if e.action.computation_type == B]
    forward = [e for e in mine if e.action.computation_type == F]
    finish = max(e.end_s for e in mine)
    reduce, gather = _chunk_comm(model, layout, costs, rank)
    ready = []
    for c in range(layout.vpp):
        last = max(i for i, e in enumerate(backward) if chunk_of[e.action.stage_index] == c)
        launch = last + rank
        ready.append(backward[launch].end_s if launch < len(backward) else finish)
    order = sorted(range(layout.vpp), key=lambda c: ready[c])
    reduce_end = step.serial_stream_ends([ready[c] for c in order], [reduce[c] for c in order])[-1]
    first = [min(i for i, e in enumerate(forward) if chunk_of[e.action.stage_index] == c) for c in range(layout.vpp)]
    due = [forward[k].start_s for k in first]
    launches = [0.0 if c < 2 else forward[max(0, first[c - 1] - rank)].start_s for c in range(layout.vpp)]
    ends = step.serial_stream_ends(launches, gather)
    return max(0.0, reduce_end - finish) + max(0.0, *(e - d for e, d in zip(ends, due, strict=True)))


@pytest.mark.parametrize(("pp", "vpp", "m", "dp"), [(4, 2, 8, 8), (4, 4, 8, 16), (8, 2, 16, 4), (2, 4, 2, 32)])
def test_closed_form_is_never_below_the_timeline(pp, vpp, m, dp):
    model, layout = _case(pp, vpp, m, dp)
    costs = chunk_costs(model, layout, SEQ)
    for rank in range(pp):
        closed = interleaved_dp_exposed(model, layout, costs, rank)
        timeline = _timeline_exposure(model, layout, costs, rank)
        assert timeline - 1e-9 <= closed, rank
        reduce, _ = _chunk_comm(model, layout, costs, rank)
        assert timeline >= reduce[0] - 1e-9  # chunk 0's reduction starts after the last backward


def test_only_the_first_chunk_stays_exposed_when_the_windows_are_long():
    """Many micro-batches of big chunks: every later chunk hides; chunk 0's reduce-scatter
    (launched after the last backward) and all-gather (needed by the first forward) remain."""
    model, layout = _case(4, 2, 16, 8)
    costs = chunk_costs(model, layout, SEQ)
    reduce, gather = _chunk_comm(model, layout, costs, 1)
    assert interleaved_dp_exposed(model, layout, costs, 1) == pytest.approx(reduce[0] + gather[0], rel=1e-9)


def test_chunk_params_add_up_to_the_rank():
    model, layout = _case(4, 2, 8, 8)
    costs = chunk_costs(model, layout, SEQ)
    for rank in range(layout.pp):
        assert sum(costs.chunk_params[rank]) == pytest.approx(costs.params[rank], rel=1e-12)


def test_per_chunk_sync_only_for_megatron_interleaving_with_overlap():
    """Without overlap (reduction after the flush) and for 1F1B the old path stays."""
    model, layout = _case(4, 2, 8, 8)
    costs = chunk_costs(model, layout, SEQ)
    assert exposed_dp_times(model, layout, costs)[1] == interleaved_dp_exposed(model, layout, costs, 1)
    flush = CostModel(model.spec, model.cluster, CostOptions.of(interference=False, overlap_grad_reduce=False))
    assert exposed_dp_times(flush, layout, costs)[1] > interleaved_dp_exposed(model, layout, costs, 1)


def test_megatron_defaults_align_the_reductions():
    """The launch rules priced here are Megatron-LM's defaults: align_grad_reduce is on
    (read from the installed Megatron-LM source; its training package needs a GPU stack)."""
    core = importlib.util.find_spec("megatron.core")
    if core is None or core.origin is None:
        pytest.skip("megatron-core is not installed")
    config = Path(core.origin).parents[1] / "training" / "config" / "common_config.py"
    if not config.exists():
        pytest.skip("Megatron-LM's training package is not installed")
    assert re.search(r"^\s*align_grad_reduce: bool = True", config.read_text(), re.MULTILINE)
