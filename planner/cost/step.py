"""Per-step work outside the pipeline: what a rank runs once per step after its last backward.

Megatron-LM's `finalize_model_grads` and `optimizer.step()` run, in this order:

1. the data-parallel gradient reduction (its exposed part is `exposed_after_window`'s, below);
2. the tied embedding's gradient all-reduce between the first and the last pipeline stage
   (`_allreduce_word_embedding_grads`, megatron/core/distributed/finalize_model_grads.py):
   the fp32 (or `grad_reduce_bytes`) main grads of the vocab x hidden / TP word embedding, over
   the two-rank embedding group, only when the model ties them and they sit on different ranks;
3. with fp16, the loss-scale check (`_unscale_main_grads_and_check_for_nan`,
   megatron/core/optimizer/optimizer.py): `torch._amp_foreach_non_finite_check_and_unscale_`
   reads and writes every fp32 main grad the rank owns, then one value (found_inf) is
   all-reduced (MAX) over the grad-stats group; bf16 and fp32 have no loss scale;
4. the gradient norm for clipping (`get_grad_norm_fp32`, megatron/core/optimizer/clip_grads.py):
   `multi_tensor_l2norm` reads every owned fp32 main grad once, then one value is all-reduced
   (SUM) over the grad-stats group: the model-parallel group (TP x PP) without a distributed
   optimizer, every rank of the distributed optimizer instance (DP x CP x TP x PP) with it
   (`DistributedOptimizer.get_grad_stats_parallel_group`). The clip itself rescales the grads
   only when the norm exceeds the threshold, which is data-dependent and not charged;
5. the Adam step as multi-tensor kernels over the owned parameters (`multi_tensor_time`), then
   the copy of the fp32 main parameters into the bf16 model parameters.

Multi-tensor kernels (apex `multi_tensor_applier = MultiTensorApply(2048 * 32)`, the same chunk
in Transformer Engine's `multi_tensor_apply`) cut the tensors into chunks of 2048 x 32 = 65,536
elements and launch one kernel per 320 chunks (`depth_to_max_blocks` in apex
csrc/multi_tensor_apply.cuh and PyTorch ATen/native/cuda/MultiTensorApply.cuh): a launch per
20.97 M elements, each paying the GPU's per-kernel overhead, on top of the memory-bound traffic.
The per-launch tensor limit (36 tensors at depth 4) binds only for tensors under 0.6 M elements
and is not charged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

from planner.cost.comm import Network
from planner.cost.compute import AnalyticCompute

OptimizerKernels = Literal["fused", "foreach"]
OPTIMIZER_KERNELS: tuple[str, ...] = get_args(OptimizerKernels)
"""How the optimizer step and the gradient clipping run: fused multi-tensor kernels (apex /
Transformer Engine FusedAdam, Megatron's clip), or PyTorch's foreach ops (torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_ without `fused=True`: torchtitan's default)."""

MULTI_TENSOR_CHUNK = 2048 * 32
"""Elements per multi_tensor_apply chunk (apex / Transformer Engine / torch `_foreach`)."""
MULTI_TENSOR_MAX_BLOCKS = 320
"""Chunks per multi_tensor_apply launch (apex / ATen `depth_to_max_blocks`)."""
ADAM_BYTES_PER_PARAM = 28.0
"""Fused Adam over fp32 main parameters (apex / TE FusedAdam): read parameter, grad, m, v
(16 B), write parameter, m, v (12 B)."""
PARAM_COPY_BYTES_PER_PARAM = 6.0
"""Megatron's `_copy_main_params_to_model_params`: read the fp32 main parameter (4 B), write
the bf16 model parameter (2 B). FSDP (ZeRO-3) keeps fp32 parameters and casts on all-gather."""
GRAD_NORM_BYTES_PER_PARAM = 4.0
"""`multi_tensor_l2norm` reads each fp32 main grad once."""
FOREACH_ADAMW_BYTES_PER_PARAM = 80.0
"""torch.optim.AdamW's foreach implementation (`_multi_tensor_adam`, the one PyTorch picks on
CUDA when `fused` is not asked for; torch 2.6), one pass per op over fp32 tensors: weight decay
`_foreach_mul_(params)` 8 B, `_foreach_lerp_(exp_avgs, grads)` 12, `_foreach_mul_(exp_avg_sqs)`
8, `_foreach_addcmul_(exp_avg_sqs, grads, grads)` 12, `exp_avg_sq_sqrt = _foreach_sqrt(...)` 8,
`_foreach_div_(exp_avg_sq_sqrt, ...)` 8, `_foreach_add_(exp_avg_sq_sqrt, eps)` 8,
`_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt)` 16."""
CLIP_GRAD_NORM_BYTES_PER_PARAM = 12.0
"""torch.nn.utils.clip_grad_norm_ (foreach): `_foreach_norm` reads each grad (4 B), then
`_foreach_mul_(grads, clip_coef_clamped)` rescales every grad whatever the norm (8 B): the
multiply by the coefficient clamped to 1 is unconditional, unlike Megatron's."""
UNSCALE_BYTES_PER_PARAM = 8.0
"""`_amp_foreach_non_finite_check_and_unscale_` reads and writes each fp32 main grad."""
MAIN_GRAD_CAST_BYTES_PER_PARAM = 6.0
"""Megatron-LM's `_copy_model_grads_to_main_grads` with 16-bit gradients: `.float()` reads the
16-bit gradient (2 B) and writes the fp32 main gradient (4 B)."""
SCALAR_BYTES = 4
"""The norm (fp32) or found_inf flag all-reduced across ranks."""


def multi_tensor_launches(elements: float) -> int:
    """Kernel launches of one multi_tensor_apply pass over `elements` elements."""
    if elements <= 0:
        return 0
    return math.ceil(elements / (MULTI_TENSOR_CHUNK * MULTI_TENSOR_MAX_BLOCKS))


def multi_tensor_time(compute: AnalyticCompute, elements: float, bytes_per_element: float) -> float:
    """Seconds of one memory-bound multi-tensor pass moving `bytes_per_element` per element."""
    return compute.elementwise_time(elements * bytes_per_element, multi_tensor_launches(elements))


def owned_params(params: float, zero_stage: int, dp_shards: int) -> float:
    """Parameters whose optimizer state (and fp32 main grad) this GPU owns."""
    return params / dp_shards if zero_stage >= 1 else params


def adam_time(
    compute: AnalyticCompute, params: float, zero_stage: int, dp_shards: int, kernels: OptimizerKernels = "fused"
) -> float:
    """The Adam step over the owned parameters plus the main-to-model parameter copy; with
    `kernels` "foreach", torch.optim.AdamW's foreach passes instead of one fused kernel."""
    owned = owned_params(params, zero_stage, dp_shards)
    per_param = FOREACH_ADAMW_BYTES_PER_PARAM if kernels == "foreach" else ADAM_BYTES_PER_PARAM
    step = multi_tensor_time(compute, owned, per_param)
    if zero_stage < 3:
        step += multi_tensor_time(compute, owned, PARAM_COPY_BYTES_PER_PARAM)
    return step


def main_grad_cast_time(compute: AnalyticCompute, params: float, zero_stage: int, dp_shards: int) -> float:
    """Seconds of casting the owned 16-bit gradients into fp32 main gradients before the step
    (one `.float()` per parameter tensor; their per-tensor launches are not counted)."""
    return compute.elementwise_time(owned_params(params, zero_stage, dp_shards) * MAIN_GRAD_CAST_BYTES_PER_PARAM, 0)


def ddp_grad_copy_time(compute: AnalyticCompute, params: float, grad_bytes: int, passes: int) -> float:
    """Seconds of a DDP implementation's `passes` read-and-write copies over the rank's
    `params` gradients of `grad_bytes` each, around the data-parallel all-reduce."""
    return compute.elementwise_time(params * passes * 2 * grad_bytes, 0)


def grad_stats_all_reduce(net: Network, tp: int, cp: int, dp: int, pp: int, zero_stage: int) -> float:
    """One fp32 value all-reduced over the grad-stats group: TP, then (distributed optimizer)
    DP x CP, then PP, as nested all-reduces of each level of the rank order tp-cp-dp-pp."""
    time = net.all_reduce(SCALAR_BYTES, tp, 1)
    if zero_stage >= 1:
        time += net.all_reduce(SCALAR_BYTES, cp * dp, tp)
    return time + net.all_reduce(SCALAR_BYTES, pp, tp * cp * dp)


def grad_norm_time(
    compute: AnalyticCompute,
    net: Network,
    params: float,
    tp: int,
    cp: int,
    dp: int,
    pp: int,
    zero_stage: int,
    kernels: OptimizerKernels = "fused",
) -> float:
    """The L2 norm of the owned grads and its all-reduce over the grad-stats group; with
    `kernels` "foreach", torch's clip_grad_norm_, whose rescale of the grads always runs."""
    owned = owned_params(params, zero_stage, cp * dp)
    per_param = CLIP_GRAD_NORM_BYTES_PER_PARAM if kernels == "foreach" else GRAD_NORM_BYTES_PER_PARAM
    local = multi_tensor_time(compute, owned, per_param)
    return local + grad_stats_all_reduce(net, tp, cp, dp, pp, zero_stage)


def loss_scale_time(
    compute: AnalyticCompute,
    net: Network,
    dtype: str,
    params: float,
    tp: int,
    cp: int,
    dp: int,
    pp: int,
    zero_stage: int,
) -> float:
    """fp16's found-inf check and unscale of the owned grads and the flag's all-reduce; 0 otherwise."""
    if dtype != "fp16":
        return 0.0
    owned = owned_params(params, zero_stage, cp * dp)
    local = multi_tensor_time(compute, owned, UNSCALE_BYTES_PER_PARAM)
    return local + grad_stats_all_reduce(net, tp, cp, dp, pp, zero_stage)


def tied_embedding_time(
    net: Network, vocab: int, hidden: int, grad_bytes: int, tp: int, cp: int, dp: int, pp: int
) -> float:
    """All-reduce of the word embedding's grads between the first and last pipeline rank."""
    if pp == 1:
        return 0.0
    nbytes = grad_bytes * vocab * hidden / tp
    return net.all_reduce(nbytes, 2, tp * cp * dp * (pp - 1))


def exposed_after_window(
    total_s: float, window_s: float, params: float, bucket_params: float, tail_params: float
) -> float:
    """Exposed seconds of a collective split into buckets that run one after another on one
    stream, each as soon as a `window_s` compute, producing parameters at an even rate, has
    made its input ready: buckets of `bucket_params` and, exposed after the compute, a last
    one of `tail_params` (for the parameter all-gather, the mirror image: the first bucket
    consumed is the tail, and the compute must not outrun the gathered buckets).

    Bucket k ends at max_j (ready_j + the comm of buckets j..k); after the last one the
    compute has ended, and the maximum over j lies at the first bucket, the last full one or
    the tail, so with b = bucket / params and t = tail / params:

        max(total t,  total (b + t) - window t,  total - window (1 - b))

    (Megatron-LM's bucketed overlap: megatron/core/distributed/param_and_grad_buffer.py)."""
    if total_s <= 0.0 or params <= 0.0:
        return 0.0
    tail = min(1.0, tail_params / params)
    bucket = min(1.0, bucket_params / params)
    return max(total_s * tail, total_s * min(1.0, bucket + tail) - window_s * tail, total_s - window_s * (1.0 - bucket))


def serial_stream_ends(ready_s: Sequence[float], comm_s: Sequence[float]) -> list[float]:
    """End times of collectives that one stream runs one after another in the given order,
    each as soon as it is ready (`ready_s`) and the previous one has ended."""
    ends, last = [], -math.inf
    for ready, comm in zip(ready_s, comm_s, strict=True):
        last = max(last, ready) + comm
        ends.append(last)
    return ends


FSDP2_COPY_OUT_READS_WRITES = 2
"""FSDP2 copies each all-gather's output into the unsharded parameters it views
(`foreach_all_gather_copy_out`: `split_with_sizes_copy` in `FSDPParamGroup.wait_for_unshard`, on
the compute stream): the gathered parameter read once and written once."""


FSDP1_GRAD_CAT_READS_WRITES = 2
"""FSDP1 builds its parameters as views of the flat parameter (`FlatParamHandle._get_unflat_views_unaligned`:
`torch.split(tensor, flat_param._numels, dim=0)` then `.view(shape)`), so autograd's backward of
that split (`split_with_sizes_backward`: `at::cat` of the views' gradients) writes each unit's
unsharded flat gradient: every gradient element read once and written once."""


def fsdp1_grad_cat_time(compute: AnalyticCompute, params: float, dtype_bytes: int, reduces: int, calls: int) -> float:
    """Seconds of FSDP1's gradient assembly over one rank's unsharded `params` in a step: `reduces`
    backward passes (one per micro-batch without no_sync) each concatenating the parameter-dtype
    gradients into the flat gradient the reduce-scatter reads, one memory-bound kernel per FSDP unit
    (`calls`) each, on the compute stream."""
    return compute.elementwise_time(params * reduces * FSDP1_GRAD_CAT_READS_WRITES * dtype_bytes, calls * reduces)


def fsdp2_copy_time(
    compute: AnalyticCompute,
    params: float,
    dtype_bytes: int,
    grad_reduce_bytes: int,
    gathers: int,
    reduces: int,
    calls: int,
) -> float:
    """Seconds of FSDP2's per-parameter copy kernels over one rank's unsharded `params` in a
    step: `gathers` all-gather copy-outs (read and write in the parameter dtype) and `reduces`
    reduce-scatter copy-ins (`foreach_reduce_scatter_copy_in`, `torch._chunk_cat` of the
    unsharded gradients into the reduce-scatter buffer in the reduce dtype: read `dtype_bytes`,
    write `grad_reduce_bytes`, on the compute stream before the reduce-scatter stream waits for
    it: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py `foreach_reduce`), memory-bound,
    one kernel per FSDP unit (`calls`) each."""
    copy_out = gathers * FSDP2_COPY_OUT_READS_WRITES * dtype_bytes
    nbytes = params * (copy_out + reduces * (dtype_bytes + grad_reduce_bytes))
    return compute.elementwise_time(nbytes, calls * (gathers + reduces))
