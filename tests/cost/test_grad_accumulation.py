"""Weight-gradient accumulation by autograd (planner/cost/grad_accum.py), against torch's own
autograd: micro-batches of a linear layer's backward run for real on CPU under a dispatch mode
that adds the bytes of every non-GEMM op on weight-sized tensors; and its place in `predict`."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.grad_accum import autograd_accumulation_s
from planner.cost.model import CostModel, CostOptions
from planner.layout import Layout, even_stage_layers
from planner.predict import chunk_costs, predict
from planner.spec import Cluster

GEMMS = {"mm", "addmm", "bmm", "matmul", "t", "view", "detach", "_to_copy", "empty_like", "zeros_like", "ones_like"}


class WeightTraffic(TorchDispatchMode):
    """Bytes that ops other than GEMMs and views read and write on `numel`-element tensors."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.nbytes = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in GEMMS:
            for t in tree_leaves((args, kwargs or {})) + tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.numel() == self.numel:
                    self.nbytes += t.numel() * t.element_size()
        return out


@pytest.mark.parametrize("microbatches", [1, 2, 5])
def test_autograd_adds_each_later_microbatch_gradient_once(microbatches):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=False, dtype=torch.bfloat16)
    layer.weight.grad = None  # zero_grad(set_to_none=True)
    with WeightTraffic(layer.weight.numel()) as traffic:
        for _ in range(microbatches):
            layer(torch.randn(8, 64, dtype=torch.bfloat16)).sum().backward()
    per_param = traffic.nbytes / layer.weight.numel()
    assert per_param == 3 * 2 * (microbatches - 1)
    compute = AnalyticCompute(resolve_gpu("a100-80gb"), "bf16")
    modelled = autograd_accumulation_s(compute, layer.weight.numel(), 2, microbatches) * microbatches
    assert modelled * compute.mem_bw == pytest.approx(traffic.nbytes)


def _setup(accumulation, m, pp=2):
    spec = resolve_model("megatron-gpt-1.7b")
    model = CostModel(spec, Cluster.of(resolve_gpu("a100-80gb"), 2 * pp),
                      CostOptions(dtype="fp16", wgrad_accumulation=accumulation))
    layout = Layout(tp=1, pp=pp, dp=2, vpp=1, mbs=2, num_microbatches=m, schedule="1f1b",
                    recompute=("full",) * pp, sequence_parallel=False, zero_stage=0,
                    stage_layers=even_stage_layers(spec.num_layers, pp, 1, "1f1b"))
    return model, layout


@pytest.mark.parametrize(("m", "pp"), [(1, 1), (4, 2), (16, 2)])
def test_each_chunk_carries_its_mean_add_in_the_backward_weight(m, pp):
    fused_model, layout = _setup("fused", m, pp)
    autograd_model, _ = _setup("autograd", m, pp)
    fused, summed = chunk_costs(fused_model, layout, 2048), chunk_costs(autograd_model, layout, 2048)
    bw = autograd_model.analytic.mem_bw
    for rank in range(layout.pp):
        extra = summed.backward_weight_s[rank][0] - fused.backward_weight_s[rank][0]
        assert extra == pytest.approx(fused.chunk_params[rank][0] * 6 * (m - 1) / m / bw, rel=1e-9)
        assert summed.forward_s[rank] == fused.forward_s[rank]
        assert summed.backward_input_s[rank] == fused.backward_input_s[rank]
    slower = predict(autograd_model, layout, 2 * 2 * m, 2048).step_time_s
    base = predict(fused_model, layout, 2 * 2 * m, 2048).step_time_s
    assert (slower > base) if m > 1 else (slower == base)


def test_unknown_accumulation_is_refused():
    with pytest.raises(ValueError, match="wgrad_accumulation"):
        CostOptions(wgrad_accumulation="fp32_hook")
