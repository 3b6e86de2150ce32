"""Gradient accumulation across micro-batches outside the weight-gradient GEMM.

Where the runtime fuses the accumulation into the GEMM (Megatron-LM's
`--gradient-accumulation-fusion`, 2022+: `fused_dense_cuda.wgrad_gemm_accum_fp32(input,
grad_output, weight.main_grad)` in megatron/mpu/layers.py, on only with fp32 accumulation;
Transformer Engine's `main_grad` GEMMs) the backward writes nothing more. Where it does not —
Megatron-LM before February 2022 (`grad_weight = grad_output.t().matmul(input)`), Megatron-
DeepSpeed's 2021 engine, any plain PyTorch module — each micro-batch's weight gradient is a new
tensor that autograd's `AccumulateGrad` adds into `param.grad` in place
(torch/csrc/autograd/functions/accumulate_grad.h: `variable_grad += new_grad`): it reads both
gradients and writes one, 3 x the gradient's bytes per parameter, on the compute stream inside
the backward. The first micro-batch after `zero_grad(set_to_none=True)` pays nothing (autograd
steals its gradient), so over a step of M micro-batches a parameter is added M - 1 times.
"""

from __future__ import annotations

from typing import Literal, get_args

from planner.cost.compute import AnalyticCompute

WgradAccumulation = Literal["fused", "autograd"]
WGRAD_ACCUMULATION: tuple[str, ...] = get_args(WgradAccumulation)

ACCUMULATE_READS_WRITES = 3
"""`param.grad += new_grad`: read both gradients, write the sum."""


def autograd_accumulation_s(compute: AnalyticCompute, params: float, grad_bytes: int, microbatches: int) -> float:
    """Mean seconds per micro-batch that autograd spends adding the weight gradients of
    `params` parameters into their `.grad` over a step of `microbatches` micro-batches (the
    first one's gradients are taken as they are). Per-tensor launches are not counted."""
    if microbatches <= 1 or params <= 0:
        return 0.0
    total = (microbatches - 1) * params * ACCUMULATE_READS_WRITES * grad_bytes / compute.mem_bw
    return total / microbatches
