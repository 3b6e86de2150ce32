"""Weight-gradient accumulation by autograd, and DeepSpeed BF16_Optimizer's and nanotron's adds of
each bf16 gradient into an fp32 accumulator (planner/cost/grad_accum.py), against torch's own ops:
micro-batches of a linear layer's backward run for real on CPU under a dispatch mode that adds
the bytes of every non-GEMM op on weight-sized tensors; and their place in `predict`."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.grad_accum import autograd_accumulation_s, fp32_buffer_add_s, hp_grad_add_s
from planner.cost.model import CostModel, CostOptions
from planner.layout import Layout, even_stage_layers
from planner.predict import chunk_costs, predict
from planner.spec import Cluster

GEMMS = {"mm", "addmm", "bmm", "matmul", "t", "view", "detach", "_to_copy", "empty_like", "zeros_like", "ones_like"}


class WeightTraffic(TorchDispatchMode):
    """Bytes that ops other than GEMMs and views read and write on `numel`-element tensors."""

    def __init__(self, numel: int, ignored: frozenset[str] = frozenset(GEMMS)):
        super().__init__()
        self.numel, self.nbytes, self.ignored = numel, 0, ignored

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in self.ignored:
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


def test_bf16_optimizer_adds_every_microbatch_gradient_into_fp32():
    """The pipeline engine's per-micro-batch sequence (deepspeed/runtime/pipe/engine.py
    `_exec_backward_pass`): `clear_lp_grads()` sets the bf16 grads to None, the backward runs,
    `update_hp_grads` adds `lp.grad.to(fp32)` into the fp32 accumulator."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=False, dtype=torch.bfloat16)
    accumulator = torch.zeros(layer.weight.shape, dtype=torch.float32)
    with WeightTraffic(layer.weight.numel(), frozenset(GEMMS - {"_to_copy"})) as traffic:  # the cast counts
        layer.weight.grad = None
        layer(torch.randn(8, 64, dtype=torch.bfloat16)).sum().backward()
        backward_only = traffic.nbytes
        accumulator.add_(layer.weight.grad.to(accumulator.dtype))
    compute = AnalyticCompute(resolve_gpu("a100-80gb"), "bf16")
    modelled = hp_grad_add_s(compute, layer.weight.numel()) * compute.mem_bw
    assert modelled == pytest.approx(traffic.nbytes - backward_only)


def test_nanotron_adds_every_microbatch_gradient_into_its_fp32_buffer():
    """nanotron's FP32GradientAccumulator after each micro-batch's backward
    (optim/gradient_accumulator.py `_accumulate_grad`): `fp32_grad.add_(half_param.grad)`, then
    the bf16 gradient is dropped, so the next backward writes a fresh one."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=False, dtype=torch.bfloat16)
    buffer = torch.zeros(layer.weight.shape, dtype=torch.float32)
    microbatches = 3
    with WeightTraffic(layer.weight.numel()) as traffic:
        for _ in range(microbatches):
            layer(torch.randn(8, 64, dtype=torch.bfloat16)).sum().backward()
            buffer.add_(layer.weight.grad)
            layer.weight.grad = None
    compute = AnalyticCompute(resolve_gpu("h100"), "bf16")
    modelled = microbatches * fp32_buffer_add_s(compute, layer.weight.numel()) * compute.mem_bw
    assert modelled == pytest.approx(traffic.nbytes)


def _setup(accumulation, m, pp=2, bf16_optimizer=False):
    spec = resolve_model("megatron-gpt-1.7b")
    model = CostModel(
        spec,
        Cluster.of(resolve_gpu("a100-80gb"), 2 * pp),
        CostOptions.of(
            dtype="fp16" if not bf16_optimizer else "bf16",
            wgrad_accumulation=accumulation,
            bf16_optimizer=bf16_optimizer,
        ),
    )
    layout = Layout(
        tp=1,
        pp=pp,
        dp=2,
        vpp=1,
        mbs=2,
        num_microbatches=m,
        schedule="1f1b",
        recompute=("full",) * pp,
        sequence_parallel=False,
        zero_stage=0,
        stage_layers=even_stage_layers(spec.num_layers, pp, 1, "1f1b"),
    )
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


@pytest.mark.parametrize("m", [1, 8])
def test_bf16_optimizer_charges_its_add_on_every_microbatch(m):
    plain_model, layout = _setup("fused", m)
    bf16_model, _ = _setup("fused", m, bf16_optimizer=True)
    plain, added = chunk_costs(plain_model, layout, 2048), chunk_costs(bf16_model, layout, 2048)
    for rank in range(layout.pp):
        extra = added.backward_weight_s[rank][0] - plain.backward_weight_s[rank][0]
        assert extra == pytest.approx(plain.chunk_params[rank][0] * 18 / bf16_model.analytic.mem_bw, rel=1e-9)


@pytest.mark.parametrize("m", [1, 8])
def test_fp32_buffer_charges_its_add_on_every_microbatch(m):
    """Against a runtime that leaves accumulation out: the same fresh 16-bit gradient from the
    GEMM, plus the add into the fp32 buffer on every micro-batch, the first included."""
    plain_model, layout = _setup("none", m)
    buffer_model, _ = _setup("fp32_buffer", m)
    plain, added = chunk_costs(plain_model, layout, 2048), chunk_costs(buffer_model, layout, 2048)
    for rank in range(layout.pp):
        extra = added.backward_weight_s[rank][0] - plain.backward_weight_s[rank][0]
        assert extra == pytest.approx(plain.chunk_params[rank][0] * 10 / buffer_model.analytic.mem_bw, rel=1e-9)
        assert added.forward_s[rank] == plain.forward_s[rank]


def test_unknown_accumulation_is_refused():
    with pytest.raises(ValueError, match="wgrad_accumulation"):
        CostOptions.of(wgrad_accumulation="fp32_hook")


@pytest.mark.parametrize("zero", [0, 1])
def test_fp32_buffer_keeps_the_bf16_gradients_beside_it(zero):
    """nanotron drops each bf16 gradient only after the whole backward has run
    (FP32GradientAccumulator.backward: `loss.backward()`, then `_accumulate_grad` per parameter),
    so at the peak every parameter has both its fp32 buffer entry and its 16-bit gradient."""
    plain_model, layout = _setup("none", 4)
    buffer_model, _ = _setup("fp32_buffer", 4)
    layout = dataclasses.replace(layout, zero_stage=zero)
    plain, buffered = predict(plain_model, layout, 16, 2048), predict(buffer_model, layout, 16, 2048)
    params = chunk_costs(plain_model, layout, 2048).params
    for rank, (without, beside) in enumerate(zip(plain.memory, buffered.memory)):
        assert beside.grads - without.grads == pytest.approx(params[rank] * plain_model.dtype_bytes, rel=1e-9)
