"""FSDP and torch-optimizer terms of the step against the runtimes' own code and closed forms:
torch.optim.AdamW's foreach passes and clip_grad_norm_ counted op by op (bytes each op reads
and writes, each distinct tensor once), FSDP2's copy kernels, and ZeRO-3's collectives in every
micro-batch."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.catalog import resolve_gpu, resolve_model
from planner.cost import step
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.predict import fsdp_root_params, predict
from planner.spec import Cluster
from tests.cost.layouts import even_1f1b

SEQ = 2048


class TensorTraffic(TorchDispatchMode):
    """Bytes the ops read and write: each distinct tensor argument once, plus what they write
    (outputs and the arguments their schema marks as mutated); scalars ignored."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))

        def tensors(tree):
            return {t.data_ptr(): t.nbytes for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.numel() > 1}

        self.bytes += sum(tensors((args, kwargs)).values()) + sum(tensors(out).values())
        for arg, value in zip(func._schema.arguments, args):
            if arg.alias_info is not None and arg.alias_info.is_write:
                self.bytes += sum(tensors(value).values())
        return out


def _params(count=3, n=1 << 15):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for _ in range(count)]
    for p in params:
        p.grad = torch.randn(n)
    return params, count * n


def test_foreach_adamw_moves_the_bytes_torch_does():
    params, n = _params()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True)
    opt.step()  # the first step creates the moments
    with TensorTraffic() as traffic:
        opt.step()
    assert traffic.bytes / n == pytest.approx(step.FOREACH_ADAMW_BYTES_PER_PARAM, abs=0.01)


def test_torch_clip_grad_norm_always_rescales():
    params, n = _params()
    with TensorTraffic() as traffic:
        torch.nn.utils.clip_grad_norm_(params, max_norm=1e9, foreach=True)  # far above the norm
    assert traffic.bytes / n == pytest.approx(step.CLIP_GRAD_NORM_BYTES_PER_PARAM, abs=0.01)


def _model(name, gpus, **options):
    return CostModel(resolve_model(name), Cluster.of(resolve_gpu("h100"), gpus), CostOptions.of(**options))


def _fsdp(spec, dp, m, *, pp=1, zero=3):
    return even_1f1b(spec, pp=pp, dp=dp, micro_batches=m, recompute="full", zero=zero)


def test_fsdp2_copies_two_gathers_and_one_reduce_per_microbatch():
    model = _model("llama3-8b", 8, fsdp2=True, grad_reduce_bytes=4)
    spec, m = model.spec, 3
    pred = predict(model, _fsdp(spec, 8, m), 8 * m, SEQ)
    total = spec.num_layers * model.layer_costs("transformer", Shard(mbs=1, seq=SEQ)).param_count + fsdp_root_params(
        model, _fsdp(spec, 8, m), 0
    )
    per_param = m * (2 * (2 + 2) + (2 + 4))  # copy-out read+write bf16 twice, bf16 -> fp32 copy-in
    kernels = (spec.num_layers + 1) * 3 * m
    compute = model.analytic
    expected = total * per_param / compute.mem_bw + kernels * compute.overhead_s
    assert pred.time_breakdown_s["fsdp_copies"] == pytest.approx(expected, rel=1e-9)
    assert "fsdp_copies" not in predict(_model("llama3-8b", 8), _fsdp(spec, 8, m), 8 * m, SEQ).time_breakdown_s


def test_zero3_collectives_recur_in_every_microbatch():
    """Without pipelining, each micro-batch beyond the first adds the same overlapped
    all-gathers and reduce-scatter: the exposed DP time grows linearly in m."""
    model = _model("llama3-8b", 64)
    spec = model.spec
    exposed = [predict(model, _fsdp(spec, 64, m), 64 * m, SEQ).time_breakdown_s["dp_comm_exposed"] for m in (1, 2, 5)]
    per_microbatch = exposed[1] - exposed[0]
    assert per_microbatch > 0
    assert exposed[2] - exposed[0] == pytest.approx(4 * per_microbatch, rel=1e-9)


def test_without_interference_hidden_collectives_of_earlier_microbatches_cost_nothing():
    model = _model("llama3-8b", 8, interference=False)
    spec = model.spec
    exposed = [predict(model, _fsdp(spec, 8, m), 8 * m, SEQ).time_breakdown_s["dp_comm_exposed"] for m in (1, 4)]
    assert exposed[1] == pytest.approx(exposed[0], rel=1e-12)


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_1_and_2_reduce_once_per_step(zero):
    model = _model("llama3-8b", 64)
    spec = model.spec
    exposed = [
        predict(model, _fsdp(spec, 64, m, zero=zero), 64 * m, SEQ).time_breakdown_s["dp_comm_exposed"] for m in (1, 4)
    ]
    assert exposed[1] == pytest.approx(exposed[0], rel=1e-12)


def test_fsdp_root_unit_opens_the_forward_and_closes_the_backward():
    """Behind a long compute window only the root unit's collectives stay exposed: the
    all-gather that opens the forward and the backward's reduce-scatter, which comes last."""
    model = _model("llama3-8b", 64, interference=False)
    spec, layout = model.spec, _fsdp(model.spec, 64, 1)
    net, root = model.network, fsdp_root_params(model, layout, 0)
    params = spec.num_layers * model.layer_costs("transformer", Shard(mbs=1, seq=SEQ)).param_count + root
    calls, shards = spec.num_layers + 1, 64
    gather = calls * net.all_gather(2 * params / calls, shards, 1)
    reduce = calls * net.reduce_scatter(4 * params / calls, shards, 1) + gather
    expected = (gather + reduce) * root / params
    exposed = predict(model, layout, 64, SEQ).time_breakdown_s["dp_comm_exposed"]
    assert exposed == pytest.approx(expected, rel=1e-9)


def test_torchtitan_plans_pay_fsdp2_copies_under_zero3_only():
    from planner.job import runtime_cost_options

    spec = resolve_model("llama3-8b")
    model = CostModel(spec, Cluster.of(resolve_gpu("h100"), 8), runtime_cost_options("torchtitan"))
    assert predict(model, _fsdp(spec, 8, 1), 8, SEQ).time_breakdown_s["fsdp_copies"] > 0
    assert "fsdp_copies" not in predict(model, _fsdp(spec, 8, 1, zero=1), 8, SEQ).time_breakdown_s
    megatron = CostModel(spec, model.cluster, runtime_cost_options("megatron"))
    assert "fsdp_copies" not in predict(megatron, _fsdp(spec, 8, 1), 8, SEQ).time_breakdown_s
