"""Measure the host time and the GPU time of one MoE layer's routed experts at a run's per-GPU
shapes, and set them beside what the cost model charges for the same work.

The question it answers (docs/moe.md "Measuring the experts' host time"): with many
local experts and few tokens each (the Megatron MoE ModelZoo's Qwen3-235B row at TP 4, EP 8:
16 experts, ~630 tokens each per micro-batch), does the host take longer to issue the experts'
GEMMs than the GPU takes to run them? The cost model charges the host per op from op counts
(planner/cost/kernel_counts.py); this times it.

The experts run as Megatron-core's TEGroupedMLP runs them: Transformer Engine's GroupedLinear
(one cuBLASLt GEMM per local expert each way, weight gradients accumulated into fp32
`main_grad` in place, as `--gradient-accumulation-fusion` has it), the gated activation between
the two, on the tokens already permuted by expert. Without Transformer Engine (`impl="torch"`,
and always on a CPU) each expert is a `torch.nn.functional.linear` over its slice, as
Megatron-core's SequentialMLP runs them, the weight gradients added by autograd.

Each pass (forward, then backward) is timed three ways after warm-up, medians over repeats:

* host: `perf_counter` around issuing the pass while the GPU is held busy by a queued sleep
  kernel, so no launch waits for the GPU: the host's own time;
* gpu: CUDA events around the pass, the sleep queued before the first event, so the whole pass
  is queued before it starts: the GPU's own time, without launch gaps;
* eager: CUDA events around the pass issued from an idle GPU (after a synchronize): what a
  pass takes when the host cannot run ahead, as after a host synchronisation.

On a CPU only the host time exists (the pass runs where it is issued); the code paths are
otherwise the same. Every measurement is repeated at half the local experts (same tokens per
expert), so the difference gives what each local expert adds, the quantity the cost model's
per-expert op count prices (`model_charges`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from planner.cost.kernel_counts import host_times, megatron_moe_block, op_counts
from planner.cost.model import CostModel
from planner.cost.moe import imbalance_of
from planner.cost.shapes import Gemm, Shard, moe_gemms

SLEEP_S = 0.2
"""Seconds the queued sleep kernel holds the GPU: far longer than the host takes to issue one
pass of the experts (milliseconds), so no launch waits for the GPU."""


@dataclass(frozen=True, slots=True)
class ExpertShapes:
    """One GPU's routed experts for one micro-batch."""

    experts: int
    tokens_per_expert: int
    hidden: int
    ffn: int
    """Each expert's FFN width on this GPU (divided by the expert TP degree)."""
    gated: bool = True
    """SwiGLU: the first GEMM computes the gate and the up projection (2 x ffn columns)."""

    @property
    def up_columns(self) -> int:
        return (2 if self.gated else 1) * self.ffn


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Seconds of one pass: the host's issue time, the GPU's run time (None on a CPU), and the
    pass issued from an idle GPU (None on a CPU)."""

    host_s: float
    gpu_s: float | None
    eager_s: float | None


@dataclass(frozen=True, slots=True)
class ModelCharges:
    """What the cost model charges per local expert, each way: the expert's two GEMMs on the
    GPU (weight gradients at the model's output traffic) and the host ops the MoE layer's count
    adds per local expert (planner/presets/megatron_moe_counts.toml `*_per_expert`: TE's
    per-expert cuBLASLt GEMMs and allocations)."""

    gpu_forward_s: float
    gpu_backward_s: float
    host_forward_s: float
    host_backward_s: float


def shapes_of(model: CostModel, shard: Shard) -> ExpertShapes:
    """The routed experts the cost model prices on the busiest GPU at `shard` (its imbalance
    prior included), from the same GEMM list the layer times are built from."""
    spec = model.spec
    if not spec.is_moe:
        raise ValueError(f"{spec.name} has no routed experts")
    imbalance = imbalance_of(spec, shard, model.options.moe.moe_imbalance)
    up = next(g for g in moe_gemms(spec, shard, imbalance) if g.name == "expert_up")
    etp = shard.etp or shard.tp
    return ExpertShapes(
        experts=up.count,
        tokens_per_expert=up.m,
        hidden=spec.hidden_size,
        ffn=spec.expert_ffn_hidden_size // etp,
        gated=spec.activation == "swiglu",
    )


def model_charges(model: CostModel, shapes: ExpertShapes) -> ModelCharges:
    """The cost model's GPU and host seconds per local expert at `shapes`, each way: the
    expert's two GEMMs as the layer prices them, and what one more local expert adds to the
    MoE block's host time."""
    compute = model.analytic
    t, h = shapes.tokens_per_expert, shapes.hidden
    gpu = compute.gemms_times([Gemm("expert_up", t, shapes.up_columns, h), Gemm("expert_down", t, h, shapes.ffn)])
    dense = op_counts(model.spec, "transformer")
    host_one, host_none = (host_times(megatron_moe_block(dense, n), compute.eff) for n in (1, 0))
    return ModelCharges(
        gpu_forward_s=gpu.forward_s,
        gpu_backward_s=gpu.backward_s,
        host_forward_s=host_one[0] - host_none[0],
        host_backward_s=host_one[1] - host_none[1],
    )


class _Experts:
    """The experts' forward on permuted tokens: fc1, gated activation, fc2."""

    def __init__(self, shapes: ExpertShapes, impl: str, device: str):
        import torch

        self.shapes, self.impl = shapes, impl
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.splits = [shapes.tokens_per_expert] * shapes.experts
        if impl == "te":
            import transformer_engine.pytorch as te

            self.fc1 = te.GroupedLinear(
                shapes.experts,
                shapes.hidden,
                shapes.up_columns,
                bias=False,
                params_dtype=dtype,
                device=device,
                fuse_wgrad_accumulation=True,
            )
            self.fc2 = te.GroupedLinear(
                shapes.experts,
                shapes.ffn,
                shapes.hidden,
                bias=False,
                params_dtype=dtype,
                device=device,
                fuse_wgrad_accumulation=True,
            )
            for param in [*self.fc1.parameters(), *self.fc2.parameters()]:
                param.main_grad = torch.zeros(param.shape, dtype=torch.float32, device=device)
        elif impl == "torch":

            def weights(rows: int, cols: int) -> list[torch.nn.Parameter]:
                return [
                    torch.nn.Parameter(torch.randn(rows, cols, dtype=dtype, device=device) * cols**-0.5)
                    for _ in range(shapes.experts)
                ]

            self.w1, self.w2 = weights(shapes.up_columns, shapes.hidden), weights(shapes.hidden, shapes.ffn)
        else:
            raise ValueError(f"impl must be 'te' or 'torch', got {impl!r}")
        self.tokens = torch.randn(sum(self.splits), shapes.hidden, dtype=dtype, device=device, requires_grad=True)
        self.grad_out = torch.randn(sum(self.splits), shapes.hidden, dtype=dtype, device=device)

    def _activation(self, x):
        import torch.nn.functional as F

        if not self.shapes.gated:
            return F.gelu(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self):
        import torch
        import torch.nn.functional as F

        if self.impl == "te":
            return self.fc2(self._activation(self.fc1(self.tokens, self.splits)), self.splits)
        outs = []
        for x, w1, w2 in zip(torch.split(self.tokens, self.splits), self.w1, self.w2):
            outs.append(F.linear(self._activation(F.linear(x, w1)), w2))
        return torch.cat(outs)

    def backward(self, out) -> None:
        out.backward(self.grad_out)


def _median(samples: list[float | None]) -> float | None:
    values = [s for s in samples if s is not None]
    return statistics.median(values) if values else None


def _timed(device: str, issue: Callable[[], Any], sleep_cycles: int) -> tuple[float, float | None, float | None]:
    """One pass three ways (module docstring): host, gpu and eager seconds. On CUDA `issue`
    runs twice (held behind a sleep, then from an idle GPU), on a CPU once."""
    import torch

    if device != "cuda":
        start = time.perf_counter()
        issue()
        return time.perf_counter() - start, None, None
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    start = time.perf_counter()
    issue()
    host = time.perf_counter() - start
    last.record()
    torch.cuda.synchronize()
    gpu = first.elapsed_time(last) * 1e-3
    first.record()
    issue()
    last.record()
    torch.cuda.synchronize()
    return host, gpu, first.elapsed_time(last) * 1e-3


def _sleep_cycles(device: str) -> int:
    """Clock cycles of a sleep kernel that lasts `SLEEP_S` at the GPU's clock (its reported
    clock rate, else an H100's 1.98 GHz boost)."""
    if device != "cuda":
        return 0
    import torch

    clock_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 1_980_000)
    return int(SLEEP_S * clock_khz * 1e3)


def measure(shapes: ExpertShapes, impl: str, device: str, repeats: int = 20, warmup: int = 3) -> dict[str, PassTimes]:
    """Time the experts' forward and backward at `shapes` with `impl` on `device` ("cuda" or
    "cpu"): medians of `repeats` after `warmup` passes each."""
    experts = _Experts(shapes, impl, device)
    cycles = _sleep_cycles(device)
    forward: list[tuple] = []
    backward: list[tuple] = []
    graphs_per_pass = 2 if device == "cuda" else 1
    for step in range(warmup + repeats):
        forward_times = _timed(device, experts.forward, cycles)
        outs = [experts.forward() for _ in range(graphs_per_pass)]  # one graph per timed backward
        backward_times = _timed(device, lambda outs=outs: experts.backward(outs.pop()), cycles)
        if step >= warmup:
            forward.append(forward_times)
            backward.append(backward_times)
    return {
        name: PassTimes(*(_median([row[i] for row in rows]) for i in range(3)))
        for name, rows in (("forward", forward), ("backward", backward))
    }


def per_expert(full: dict[str, PassTimes], half: dict[str, PassTimes], experts: int) -> dict[str, PassTimes]:
    """Seconds each local expert adds: the difference between `experts` and `experts // 2`
    local experts at the same tokens per expert, over the experts between them."""
    added = experts - experts // 2

    def slope(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (a - b) / added

    return {
        name: PassTimes(
            slope(full[name].host_s, half[name].host_s),
            slope(full[name].gpu_s, half[name].gpu_s),
            slope(full[name].eager_s, half[name].eager_s),
        )
        for name in full
    }


def report(
    shapes: ExpertShapes,
    impl: str,
    device: str,
    full: dict[str, PassTimes],
    half: dict[str, PassTimes],
    charges: ModelCharges,
) -> dict[str, Any]:
    """One JSON-ready record: what ran, what it took at all and at half the local experts, the
    per-expert share measured, and the cost model's per-expert charges."""
    return {
        "impl": impl,
        "device": device,
        "shapes": asdict(shapes),
        "measured": {name: asdict(t) for name, t in full.items()},
        "measured_half_experts": {name: asdict(t) for name, t in half.items()},
        "measured_per_expert": {name: asdict(t) for name, t in per_expert(full, half, shapes.experts).items()},
        "model_per_expert": asdict(charges),
    }
