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

The fused accumulation is not free either: the weight-gradient GEMM runs with beta = 1 into
the main gradient (Megatron's `wgrad_gemm_accum_fp32`: cublasGemmEx with an fp32 C operand;
Transformer Engine's `general_gemm(..., out=main_grad, accumulate=True)` and its grouped
GEMM's `accumulate=True` for MoE experts), so every micro-batch it reads and writes the whole
weight gradient in the main gradient's dtype: 8 bytes per weight in fp32 against the 2 a fresh
bf16 gradient writes. The GEMM's compute hides that traffic when it contracts over many tokens;
it does not when few tokens reach a weight, as with the routed experts of a fine-grained MoE
(hundreds of tokens per expert per micro-batch): `wgrad_output_bytes`.
"""

from __future__ import annotations

from typing import Literal, get_args

from planner.cost.compute import AnalyticCompute

WgradAccumulation = Literal["fused", "autograd", "fp32_buffer", "none"]
WGRAD_ACCUMULATION: tuple[str, ...] = get_args(WgradAccumulation)

ACCUMULATE_READS_WRITES = 3
"""`param.grad += new_grad`: read both gradients, write the sum."""

NEW_GRADIENT_BYTES = 2
"""A weight-gradient GEMM that writes a fresh 16-bit gradient: 2 bytes per weight."""


def wgrad_output_bytes(accumulation: WgradAccumulation, main_grad_bytes: int) -> float:
    """HBM bytes per weight that a weight-gradient GEMM moves for its output: the main gradient
    read and written in place (`main_grad_bytes` each way) under the fused accumulation, else
    a new 16-bit gradient written once."""
    return 2.0 * main_grad_bytes if accumulation == "fused" else float(NEW_GRADIENT_BYTES)


def autograd_accumulation_s(compute: AnalyticCompute, params: float, grad_bytes: int, microbatches: int) -> float:
    """Mean seconds per micro-batch that autograd spends adding the weight gradients of
    `params` parameters into their `.grad` over a step of `microbatches` micro-batches (the
    first one's gradients are taken as they are). Per-tensor launches are not counted."""
    if microbatches <= 1 or params <= 0:
        return 0.0
    total = (microbatches - 1) * params * ACCUMULATE_READS_WRITES * grad_bytes / compute.mem_bw
    return total / microbatches


FP32_BUFFER_ADD_BYTES_PER_PARAM = 10
"""nanotron's FP32GradientAccumulator after every micro-batch's backward (`_accumulate_grad`,
src/nanotron/optim/gradient_accumulator.py, v0.5: `fp32_grad.add_(half_param.grad)`, then
`half_param.grad = None`): one mixed-dtype add reads the bf16 gradient (2 B) and the fp32
accumulator (4 B) and writes the accumulator (4 B)."""


def fp32_buffer_add_s(compute: AnalyticCompute, params: float) -> float:
    """Seconds per micro-batch that nanotron's fp32 gradient accumulator spends adding the
    bf16 weight gradients of `params` parameters into its fp32 buffer. Autograd writes a fresh
    gradient every micro-batch (the previous one was set to None), so every micro-batch, the
    first included, pays this. Per-tensor launches are not counted."""
    return params * FP32_BUFFER_ADD_BYTES_PER_PARAM / compute.mem_bw if params > 0 else 0.0


HP_GRAD_ADD_BYTES_PER_PARAM = 18
"""DeepSpeed's BF16_Optimizer after every micro-batch's backward (`update_hp_grads`,
runtime/bf16_optimizer.py v0.6.2+: `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype)...)`):
the cast reads the bf16 gradient (2 B) and writes an fp32 copy (4 B); the add reads the fp32
accumulator and the copy (4 + 4 B) and writes the accumulator (4 B)."""


def hp_grad_add_s(compute: AnalyticCompute, params: float) -> float:
    """Seconds per micro-batch that DeepSpeed's BF16_Optimizer spends adding the bf16 weight
    gradients of `params` parameters into their fp32 accumulators. The pipeline engine clears
    the bf16 `.grad` to None before every backward (`clear_lp_grads`), so autograd adds nothing
    and every micro-batch, the first included, pays this. Per-tensor launches are not counted."""
    return params * HP_GRAD_ADD_BYTES_PER_PARAM / compute.mem_bw if params > 0 else 0.0
