"""The backward's tensor-parallel collectives as Megatron-LM's asynchronous column-parallel
backward issues them (planner/cost/tp_backward.py), checked against Megatron-core's own
autograd functions traced on CPU, closed forms and a brute-force two-rate timeline."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.overlap import overlapped_extra_time
from planner.cost.shapes import Shard
from planner.cost.tp_backward import BackwardCollective, backward_collectives, backward_comm_seconds
from planner.job import runtime_cost_options
from planner.layout import Layout, even_stage_layers
from planner.predict import chunk_costs
from planner.spec import Cluster

BLOCK = (("qkv", "column"), ("attn_out", "row"), ("mlp_up", "column"), ("mlp_down", "row"))
WIDTHS = {"qkv": 6, "attn_out": 3, "mlp_up": 10, "mlp_down": 5}
"""Output (column) or input (row) width of each traced linear: distinct, so each weight-gradient
GEMM's shape names its linear."""


class _FakeGroup:
    """A two-rank TP group for Megatron's functions (they only ask its size)."""

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 0


def _megatron_backward_trace(monkeypatch, sequence_parallel: bool, defer_wgrad: bool = False) -> list[tuple]:
    """Run one block's four linears (QKV and MLP-up column-parallel, the projections after them
    row-parallel) through Megatron-core's LinearWithGradAccumulationAndAsyncCommunication and
    its sequence-parallel reduce-scatter mapping, forward then backward on CPU, and record the
    backward's events in order: ("issue", collective, async), ("wait", collective) and
    ("gemm", output shape)."""
    layers = pytest.importorskip("megatron.core.tensor_parallel.layers")
    mappings = pytest.importorskip("megatron.core.tensor_parallel.mappings")
    events: list[tuple] = []

    class Handle:
        def __init__(self, op: str):
            self.op = op

        def wait(self) -> None:
            events.append(("wait", self.op))

    def collective(op: str):
        def issue(*args, group=None, async_op=False, **kwargs):
            events.append(("issue", op, async_op))
            return Handle(op) if async_op else None

        return issue

    class Buffer:
        def get_tensor(self, shape, dtype, name):
            return torch.zeros(shape, dtype=dtype)

    for module in (layers, mappings):
        monkeypatch.setattr(module, "dist_all_gather_func", collective("all_gather"))
        monkeypatch.setattr(module, "dist_reduce_scatter_func", collective("reduce_scatter"))
    monkeypatch.setattr(layers, "get_global_memory_buffer", lambda: Buffer())
    monkeypatch.setattr(torch.distributed, "all_reduce", collective("all_reduce"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    matmul = torch.Tensor.matmul

    def traced_matmul(self, other):
        out = matmul(self, other)
        events.append(("gemm", tuple(out.shape)))
        return out

    monkeypatch.setattr(torch.Tensor, "matmul", traced_matmul)
    group, hidden, tokens = _FakeGroup(), 4, 8
    apply = layers.LinearWithGradAccumulationAndAsyncCommunication.apply

    def column(x, w):  # deferral keeps grad_output for later and needs the fused accumulation
        buffer = [] if defer_wgrad else None
        return apply(x, w, None, defer_wgrad, not sequence_parallel, sequence_parallel, buffer, 0, group, 1)

    def row(x, w):
        out = apply(x, w, None, False, False, False, None, 0, group, 1)
        return (
            mappings._ReduceScatterToSequenceParallelRegion.apply(out, group, None, False) if sequence_parallel else out
        )

    weights = {
        name: torch.randn(*((WIDTHS[name], hidden) if mode == "column" else (hidden, WIDTHS[name])), requires_grad=True)
        for name, mode in BLOCK
    }
    for w in weights.values():
        w.main_grad = torch.zeros_like(w)
    x = torch.randn(tokens // 2 if sequence_parallel else tokens, 1, hidden, requires_grad=True)
    attention = row(column(x, weights["qkv"])[..., : WIDTHS["attn_out"]], weights["attn_out"])
    out = row(column(attention, weights["mlp_up"])[..., : WIDTHS["mlp_down"]], weights["mlp_down"])
    events.clear()
    out.sum().backward()
    return events


def _collectives_of(events: list[tuple]) -> tuple[BackwardCollective, ...]:
    """The traced backward as BackwardCollectives: an async collective runs beside the GEMMs
    issued between its issue and its wait (a weight-gradient GEMM has the weight's shape, the
    data-gradient GEMM is the one before it); a synchronous one, or one with no GEMM before
    its wait, is exposed; each belongs to the linear of the next GEMM it precedes or hides."""
    by_shape = {
        ((w, 4) if mode == "column" else (4, w)): name for (name, mode), w in ((lm, WIDTHS[lm[0]]) for lm in BLOCK)
    }
    gemms = [(i, e[1]) for i, e in enumerate(events) if e[0] == "gemm"]
    owner = {}
    for j, (i, shape) in enumerate(gemms):  # a wgrad names its linear, and the dgrad before it
        if shape in by_shape:
            owner[i] = (by_shape[shape], "wgrad")
            if j > 0 and gemms[j - 1][1] not in by_shape:
                owner[gemms[j - 1][0]] = (by_shape[shape], "dgrad")
    found = []
    for i, event in enumerate(events):
        if event[0] != "issue":
            continue
        op, asynchronous = event[1], event[2]
        end = (
            next((k for k in range(i + 1, len(events)) if events[k] == ("wait", op)), len(events))
            if asynchronous
            else i
        )
        beside = [owner[k] for k in range(i + 1, end) if k in owner]
        if beside:
            linear, kind = beside[0]
            found.append(BackwardCollective(linear, op, kind))
        else:
            following = next(owner[k] for k in range(i + 1, len(events)) if k in owner)
            found.append(BackwardCollective(following[0], op, "exposed"))
    return tuple(found)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_enumeration_matches_megatrons_own_backward(monkeypatch, sequence_parallel):
    traced = _collectives_of(_megatron_backward_trace(monkeypatch, sequence_parallel))
    assert traced == backward_collectives(BLOCK, sequence_parallel, asynchronous=True)


def test_megatron_backward_counts_and_volumes():
    """Per block, under SP: 2 exposed all-gathers (row-parallel output gradients), 2 more
    all-gathers of the inputs beside the data-gradient GEMMs (the re-gather: 2 activations the
    synchronous accounting never moved) and 2 reduce-scatters beside the weight-gradient GEMMs.
    Without SP: 2 all-reduces beside the weight-gradient GEMMs and nothing exposed."""
    sp = Counter((c.collective, c.beside) for c in backward_collectives(BLOCK, True, True))
    assert sp == {("all_gather", "exposed"): 2, ("all_gather", "dgrad"): 2, ("reduce_scatter", "wgrad"): 2}
    no_sp = Counter((c.collective, c.beside) for c in backward_collectives(BLOCK, False, True))
    assert no_sp == {("all_reduce", "wgrad"): 2}
    sync = Counter((c.collective, c.beside) for c in backward_collectives(BLOCK, True, False))
    assert sync == {("all_gather", "exposed"): 2, ("reduce_scatter", "exposed"): 2}
    assert [c.collective for c in backward_collectives(BLOCK, False, False)] == ["all_reduce"] * 2


def test_deferred_weight_gradient_leaves_the_reduction_alone(monkeypatch):
    """Megatron's wgrad deferral (grad_output_buffer, its delayed-wgrad path): the input
    gradient's reduce-scatter has no GEMM beside it, as `wgrad_deferred` charges it."""
    events = _megatron_backward_trace(monkeypatch, True, defer_wgrad=True)
    issued = [i for i, e in enumerate(events) if e == ("issue", "reduce_scatter", True)]
    assert len(issued) == 2
    for i in issued:
        assert events[i + 1] == ("wait", "reduce_scatter")


def test_seconds_follow_the_overlap_algebra():
    comm = {"all_gather": 2.0, "reduce_scatter": 3.0, "all_reduce": 5.0}
    gemms = {"qkv": (4.0, 1.0), "mlp_up": (1.0, 10.0)}
    f = 0.1
    async_sp = backward_collectives(BLOCK, True, True)
    expected = (
        2 * 2.0
        + overlapped_extra_time(2.0, 4.0, f)
        + overlapped_extra_time(3.0, 1.0, f)
        + overlapped_extra_time(2.0, 1.0, f)
        + overlapped_extra_time(3.0, 10.0, f)
    )
    assert backward_comm_seconds(async_sp, comm, gemms, f) == pytest.approx(expected)
    deferred = 2 * 2.0 + overlapped_extra_time(2.0, 4.0, f) + overlapped_extra_time(2.0, 1.0, f) + 2 * 3.0
    assert backward_comm_seconds(async_sp, comm, gemms, f, wgrad_deferred=True) == pytest.approx(deferred)
    sync = backward_collectives(BLOCK, True, False)
    assert backward_comm_seconds(sync, comm, gemms, f) == 2 * (2.0 + 3.0)


def _two_rate_finish(windows: list[tuple[float, float]], f: float, dt: float = 1e-5) -> float:
    """Brute force: GEMMs run one after another; each starts when the one before ends and its
    collective (issued with it) has ended; the GEMM runs at (1 - f) of its rate while the
    collective runs."""
    t = 0.0
    for comm, gemm in windows:
        start, done = t, 0.0
        while done < gemm:
            done += dt * ((1 - f) if t - start < comm else 1.0)
            t += dt
        t = max(t, start + comm)
    return t


def test_column_linear_backward_against_a_brute_force_timeline():
    f = 0.12
    for ag, rs, dgrad, wgrad in ((0.3, 0.4, 1.0, 1.2), (0.9, 1.5, 0.5, 0.6), (0.2, 2.0, 1.0, 0.4)):
        collectives = backward_collectives((("fc", "column"),), True, True)
        charged = backward_comm_seconds(
            collectives, {"all_gather": ag, "reduce_scatter": rs}, {"fc": (dgrad, wgrad)}, f
        )
        assert dgrad + wgrad + charged == pytest.approx(_two_rate_finish([(ag, dgrad), (rs, wgrad)], f), rel=1e-3)


def _model(option: str, sequence_parallel: bool = True, intra_gbps: float | None = None):
    spec = resolve_model("llama3-70b")
    cluster = Cluster.of(resolve_gpu("h100"), 8, **({} if intra_gbps is None else {"intra_node_bw_gbps": intra_gbps}))
    model = CostModel(spec, cluster, CostOptions.of(tp_backward_overlap=option))
    return model, Shard(mbs=1, seq=8192, tp=8, sequence_parallel=sequence_parallel)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_option_none_charges_the_forwards_collectives_again(sequence_parallel):
    model, shard = _model("none", sequence_parallel)
    net, act = model.network, 2 * shard.local_tokens * model.spec.hidden_size
    block = model.layer_costs("transformer", shard)
    one = net.all_gather(act, 8, 1) + net.reduce_scatter(act, 8, 1) if sequence_parallel else net.all_reduce(act, 8, 1)
    assert block.comm_backward_s == 2 * one == block.comm_forward_s
    assert block.split_backward_comm_s == 0.0
    head = model.layer_costs("head", shard)
    assert head.comm_backward_s == (net.all_gather(act, 8, 1) if sequence_parallel else net.all_reduce(act, 8, 1))


def test_async_hides_reductions_behind_large_gemms():
    (asynchronous, shard), (synchronous, _) = _model("async"), _model("none")
    a, s = asynchronous.layer_costs("transformer", shard), synchronous.layer_costs("transformer", shard)
    assert a.comm_forward_s == s.comm_forward_s
    assert a.comm_backward_s < s.comm_backward_s
    # at least the two row-parallel output-gradient gathers stay exposed
    net, act = asynchronous.network, 2 * shard.local_tokens * asynchronous.spec.hidden_size
    assert a.comm_backward_s > 2 * net.all_gather(act, 8, 1)


def test_async_regather_costs_more_where_the_link_is_slow():
    """With communication far longer than the GEMMs, overlap hides little and the re-gather's
    extra volume makes the asynchronous backward the slower one."""
    (asynchronous, shard), (synchronous, _) = _model("async", intra_gbps=5.0), _model("none", intra_gbps=5.0)
    small = replace(shard, seq=512)
    assert (
        asynchronous.layer_costs("transformer", small).comm_backward_s
        > synchronous.layer_costs("transformer", small).comm_backward_s
    )


def test_delayed_wgrad_charges_the_reductions_exposed():
    (asynchronous, shard), (delayed, _) = _model("async"), _model("async_delayed_wgrad")
    a, d = asynchronous.layer_costs("transformer", shard), delayed.layer_costs("transformer", shard)
    assert a.split_backward_comm_s > 0
    assert d.split_backward_comm_s == 0.0
    assert d.comm_backward_s == pytest.approx(a.comm_backward_s + a.split_backward_comm_s)


def _layout(schedule: str, spec, pp: int = 2) -> Layout:
    return Layout(
        tp=8,
        pp=pp,
        dp=1,
        cp=1,
        vpp=1,
        mbs=1,
        num_microbatches=8,
        schedule=schedule,
        recompute=("none",) * pp,
        sequence_parallel=True,
        zero_stage=1,
        stage_layers=even_stage_layers(spec.num_layers, pp, 1, schedule),
    )


def test_split_backward_schedules_charge_the_deferred_reductions():
    spec = resolve_model("llama3-70b")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 16), CostOptions())
    together, split = chunk_costs(model, _layout("1f1b", spec), 8192), chunk_costs(model, _layout("zb_h1", spec), 8192)
    shard = Shard(mbs=1, seq=8192, tp=8, sequence_parallel=True)
    block, head = model.layer_costs("transformer", shard), model.layer_costs("head", shard)
    layers = spec.num_layers // 2
    assert split.backward_weight_s == together.backward_weight_s
    assert split.backward_input_s[0][0] - together.backward_input_s[0][0] == pytest.approx(
        layers * block.split_backward_comm_s
    )
    assert split.backward_input_s[1][0] - together.backward_input_s[1][0] == pytest.approx(
        layers * block.split_backward_comm_s + head.split_backward_comm_s
    )


def test_runtimes_choose_their_backward():
    assert CostOptions().tensor.tp_backward_overlap == "async"
    assert runtime_cost_options("megatron").tensor.tp_backward_overlap == "async"
    assert runtime_cost_options(None).tensor.tp_backward_overlap == "async"
    assert runtime_cost_options("torchtitan").tensor.tp_backward_overlap == "none"
    assert runtime_cost_options("torch").tensor.tp_backward_overlap == "none"
    with pytest.raises(ValueError):
        CostOptions.of(tp_backward_overlap="overlapped")
