"""The memory-bound kernels FP8 training adds around a block's linears: Transformer Engine's and
torchao's.

Transformer Engine quantizes every bf16 operand of a linear's GEMMs to fp8 before the GEMM
(per-tensor scaling; transformer_engine/pytorch/module/{linear,layernorm_linear,layernorm_mlp,
base}.py at v1.0, the recipe megatron-core and NeMo run by default). Hopper's FP8 GEMMs take the
"TN" layout only, so there each operand is written twice, as is and transposed; where a GPU's
FP8 GEMMs take any layout (`GpuSpec.fp8_gemm_layouts` "any": Blackwell, TE 2.x
`is_non_tn_fp8_gemm_supported`, compute capability 10.x) it is written once and no transpose
runs. Per block on a "TN" GPU, beside the bf16 path's kernels:

    output projection input   fp8_cast_transpose_fused: read 2 B, write 1 + 1 B per element
    gradient of a column-parallel linear's output (QKV; the MLP's up projection unless its
        activation's backward is fused with the cast, as GeLU's is): cast-transpose, 4 B
    gradient of a row-parallel linear's output (output and down projections): under sequence
        parallelism cast on the local shard (read 2, write 1), gathered in fp8, transposed after
        the gather (read 1, write 1), the bias gradient a pass of its own (read 2); otherwise
        one fused cast-transpose (bias gradient inside), 4 B
    the weight gradient's transposed input of the norms' and the activation's fused fp8
        outputs (QKV, up and down projections): fp8_transpose, read 1, write 1 B
    saved: those three fused producers write 1 B per element instead of 2

and once per step, the first micro-batch's cast of each weight into fp8 and its transpose
(read 2, write 1 + 1 B per weight: megatron-core passes `is_first_microbatch`, so later
micro-batches reuse the cached copies). Under sequence parallelism the tensor-parallel
all-gathers move the fp8 copies, 1 B per element (`GATHERED_FP8_BYTES`).

On an "any"-layout GPU every cast writes its one copy (read 2, write 1 B) and the transposes are
gone.

That is the "delayed" recipe (each scale from an amax history; Megatron-LM's `--fp8-recipe`
default). Under "tensorwise" (per-tensor current scaling, TE 2.x `Float8CurrentScaling`; read at
v2.8: csrc/quantizer.cpp `Float8CurrentScalingQuantizer::quantize_impl`, csrc/extensions/
normalization.cpp and activation.cpp, module/base.py `grad_output_preprocess`,
module/layernorm_mlp.py `_act_func`) each tensor is scaled by its own amax, taken before the cast:

    a standalone cast (output projection input, every output gradient, each weight once per
        step): an amax pass first, read 2 B per element, and the scale computed from it
    the norms' and the activation's outputs: no fused fp8 output; the producer writes bf16 and
        its amax, then a cast; under sequence parallelism (norm outputs) the shard is cast, read 2
        and write 1 B, gathered and transposed as before; otherwise cast and transposed at once,
        4 B, with no transpose in the backward
    the activation's backward: no fused cast for GeLU either; amax pass and cast-transpose
    under sequence parallelism, the norm outputs' and the row-parallel output gradients' amaxes
        all-reduced over the tensor-parallel group (`amax_reductions`), four per block

Transformer Engine's own GEMM benchmark checks the per-element counts: on an H200 NVL, quantizing
both operands of a layer's 12 GEMMs in autocast adds 2.19 ms with delayed scaling and 3.50 ms with
current scaling, 6 against 4 B per element at the same bandwidth (docs/h100_rates.md).

torchao's float8 training (`torchao_block_casts`; the "tensorwise" recipe torchtitan defaults to)
scales each operand by its own amax each time, and its kernels are what torch.compile generates
around `Float8Linear`; their traffic is taken from torchao's own roofline model of them
(torchao/testing/training/roofline_utils.py at 104f01a, `get_tensor_memory_traffic_ovhd_s`,
`get_float8_mem_sympy`): an activation or output gradient takes an amax pass (read 2 B per element,
or nothing where it fuses with the op that produced the tensor: the model's `enable_fusion_modeling`)
and a cast writing it twice in fp8 (read 2, write 1 + 1), 4 to 6 B, priced at the middle, 5; a weight
takes an amax pass and two casts, one for the forward GEMM and one transposed for the backward
(2 + 3 + 3 = 8 B), every micro-batch. Each two-stage amax is two kernels.

Priced for the standard attention block and a dense MLP; latent attention's projections and an
MoE block's experts (Transformer Engine's grouped linears) are not priced here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from planner.cost.shapes import Gemm, Shard, attention_gemms, transformer_gemms
from planner.spec import GpuSpec, ModelSpec

Fp8Casts = Literal["transformer_engine", "torchao", "none"]
FP8_CASTS: tuple[str, ...] = get_args(Fp8Casts)
"""How FP8 operands are quantized: Transformer Engine's kernels, torchao's float8 training
(tensorwise scaling under torch.compile), or not priced."""

Fp8Recipe = Literal["delayed", "tensorwise"]
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
"""Transformer Engine's scaling of its FP8 tensors, by Megatron-LM's `--fp8-recipe` names:
"delayed" (each scale from an amax history, the amax taken inside the cast) or "tensorwise"
(per-tensor current scaling: each tensor's own amax, taken before its cast)."""

AMAX_BYTES = 2
"""Under "tensorwise", the amax pass before a cast: read the bf16 tensor once."""
AMAX_KERNELS = 2
"""The amax (nvte_compute_amax) and the scale computed from it (nvte_compute_scale_from_amax)."""
SCALE_AND_CAST_KERNELS = 2
"""Under "tensorwise", where a norm or an activation takes the amax as it writes its bf16 output
(TE 2.x `FUSED_NORM_AMAX_FP8`, `FUSED_ACTIVATION_AMAX_FP8`): the scale and the cast after it."""
CAST_TRANSPOSE_BYTES = 4
"""A bf16 element cast to fp8 and written twice, as is and transposed: read 2, write 1 + 1."""
CAST_BYTES = 3
"""A bf16 element cast to fp8 and written once: read 2, write 1."""
TRANSPOSE_BYTES = 2
"""An fp8 element transposed: read 1, write 1."""
BIAS_GRAD_BYTES = 2
"""A bias gradient's own pass: read the bf16 output gradient."""
FUSED_OUTPUT_SAVING = 1
"""A producer fused with the cast writes 1 byte per element instead of bf16's 2."""
GATHERED_FP8_BYTES = 1
"""Bytes per element of a sequence-parallel all-gather of an fp8 operand."""
TORCHAO_OPERAND_BYTES = (4 + 6) / 2
"""torchao tensorwise, an activation or output gradient: cast written twice (read 2, write 1 + 1),
plus an amax pass (read 2) unless fused with its producer: the middle of 4 and 6 B."""
TORCHAO_OPERAND_KERNELS = 3
"""The amax's two stages and the cast."""
TORCHAO_WEIGHT_BYTES = (2 + 3, 3)
"""torchao tensorwise, a weight: forward amax (read 2) and cast (read 2, write 1); backward the
transposed cast (read 2, write 1)."""
TORCHAO_WEIGHT_KERNELS = (3, 1)


@dataclass(frozen=True, slots=True)
class CastWork:
    """HBM bytes and kernels the quantization adds to one block's forward and backward."""

    bytes_fwd: float = 0.0
    bytes_bwd: float = 0.0
    kernels_fwd: int = 0
    kernels_bwd: int = 0

    def __add__(self, other: CastWork) -> CastWork:
        return CastWork(
            bytes_fwd=self.bytes_fwd + other.bytes_fwd,
            bytes_bwd=self.bytes_bwd + other.bytes_bwd,
            kernels_fwd=self.kernels_fwd + other.kernels_fwd,
            kernels_bwd=self.kernels_bwd + other.kernels_bwd,
        )


def writes_transposes(gpu: GpuSpec) -> bool:
    """Whether an fp8 operand is also written transposed on `gpu` (its FP8 GEMMs take "TN" only)."""
    return gpu.fp8_gemm_layouts == "tn"


def _standalone_cast(transposes: bool, recipe: Fp8Recipe) -> tuple[int, int]:
    """Bytes per element and kernels of casting a bf16 tensor to fp8 by itself: the cast (and its
    transposed copy on a "TN"-only GPU), after an amax pass and a scale kernel under "tensorwise"."""
    cast = CAST_TRANSPOSE_BYTES if transposes else CAST_BYTES
    return (AMAX_BYTES + cast, AMAX_KERNELS + 1) if recipe == "tensorwise" else (cast, 1)


def _priced_gemms(spec: ModelSpec, shard: Shard) -> tuple[Gemm, ...]:
    """The block's linears whose quantization is priced: a standard attention block's and its
    dense MLP's (an MoE block's attention only; none under latent attention)."""
    if spec.is_mla:
        return ()
    return tuple(attention_gemms(spec, shard)) if spec.is_moe else transformer_gemms(spec, shard)


def te_block_casts(spec: ModelSpec, shard: Shard, transposes: bool = True, recipe: Fp8Recipe = "delayed") -> CastWork:
    """What Transformer Engine's FP8 quantization adds to one block's forward and backward on
    one GPU, per micro-batch, under `recipe` (the tables in the module docstring); `transposes`:
    the GPU's FP8 GEMMs take the "TN" layout only, so each operand is also written transposed."""
    gemms = {g.name: g for g in _priced_gemms(spec, shard)}
    if not gemms:
        return CastWork()
    h, tokens, rep_tokens = spec.hidden_size, shard.local_tokens, shard.elementwise_tokens
    gathered = shard.tp > 1 and shard.sequence_parallel
    tensorwise = recipe == "tensorwise"
    cast = CAST_TRANSPOSE_BYTES if transposes else CAST_BYTES
    transpose, transpose_kernels = (TRANSPOSE_BYTES, 1) if transposes else (0, 0)
    standalone, standalone_kernels = _standalone_cast(transposes, recipe)

    def forward_cast(elements: float) -> CastWork:
        return CastWork(bytes_fwd=standalone * elements, kernels_fwd=standalone_kernels)

    def backward_cast(elements: float) -> CastWork:
        return CastWork(bytes_bwd=standalone * elements, kernels_bwd=standalone_kernels)

    def producer_output(local: float, full: float, gathered_shard: bool) -> CastWork:
        """A norm's or the activation's output, `local` elements on this GPU (`full` after a
        sequence-parallel gather when `gathered_shard`), the input of the linear after it."""
        later_transpose = CastWork(bytes_bwd=transpose * full, kernels_bwd=transpose_kernels)
        if not tensorwise:  # the producer writes fp8; its transpose for the weight gradient later
            return CastWork(bytes_fwd=-FUSED_OUTPUT_SAVING * local) + later_transpose
        if gathered_shard:  # the producer writes bf16 and its amax; the shard cast, gathered, transposed later
            return CastWork(bytes_fwd=CAST_BYTES * local, kernels_fwd=SCALE_AND_CAST_KERNELS) + later_transpose
        return CastWork(bytes_fwd=cast * full, kernels_fwd=SCALE_AND_CAST_KERNELS)  # cast and transposed at once

    def row_parallel_output_grad() -> CastWork:
        if not gathered:
            return backward_cast(tokens * h)
        local, bias = tokens / shard.tp * h, spec.linear_bias
        amax, amax_kernels = (AMAX_BYTES, AMAX_KERNELS) if tensorwise else (0, 0)
        nbytes = (amax + CAST_BYTES) * local + transpose * tokens * h + (BIAS_GRAD_BYTES * local if bias else 0.0)
        return CastWork(bytes_bwd=nbytes, kernels_bwd=1 + amax_kernels + transpose_kernels + int(bias))

    qkv, out = gemms["qkv"], gemms["attn_out"]
    work = (
        producer_output(rep_tokens * h, tokens * h, gathered)  # the attention norm
        + forward_cast(tokens * out.k)
        + backward_cast(tokens * qkv.n)
        + row_parallel_output_grad()
    )
    if "mlp_up" in gemms:
        up, down = gemms["mlp_up"], gemms["mlp_down"]
        work += producer_output(rep_tokens * h, tokens * h, gathered)  # the MLP norm
        work += producer_output(tokens * down.k, tokens * down.k, False)  # the activation
        if spec.activation != "gelu" or tensorwise:  # only GeLU's backward fuses the delayed cast
            work += backward_cast(tokens * up.n)
        work += row_parallel_output_grad()
    return work


def amax_reductions(spec: ModelSpec, shard: Shard, recipe: Fp8Recipe) -> int:
    """Tensor-parallel all-reduces of one amax (4 bytes) in each of a block's forward and
    backward: under "tensorwise" with sequence parallelism, each priced column-parallel linear's
    input (a norm output, gathered in fp8) and each row-parallel linear's output gradient are
    scaled by their amax over the TP group; two each way for a dense block."""
    if recipe != "tensorwise" or shard.tp == 1 or not shard.sequence_parallel:
        return 0
    return sum(1 for g in _priced_gemms(spec, shard) if g.name in ("qkv", "mlp_up"))


def te_weight_casts(
    spec: ModelSpec, shard: Shard, transposes: bool = True, recipe: Fp8Recipe = "delayed"
) -> tuple[float, int]:
    """HBM bytes and kernels of one block's once-per-step cast of its priced linears' weights
    into fp8 (and their transposes on a "TN"-only GPU), each after its amax pass under
    "tensorwise", on one GPU."""
    gemms = _priced_gemms(spec, shard)
    standalone, standalone_kernels = _standalone_cast(transposes, recipe)
    return standalone * sum(g.n * g.k * g.count for g in gemms), len(gemms) * standalone_kernels


def torchao_block_casts(spec: ModelSpec, shard: Shard) -> CastWork:
    """What torchao's tensorwise float8 training adds to one block's forward and backward on one
    GPU, per micro-batch: each linear's input, weight and output gradient scaled and cast (the
    module docstring), as torchao's roofline model of its compiled kernels counts them."""
    gemms = _priced_gemms(spec, shard)
    fwd = bwd = 0.0
    for g in gemms:
        fwd += g.count * (TORCHAO_OPERAND_BYTES * g.m * g.k + TORCHAO_WEIGHT_BYTES[0] * g.n * g.k)
        bwd += g.count * (TORCHAO_OPERAND_BYTES * g.m * g.n + TORCHAO_WEIGHT_BYTES[1] * g.n * g.k)
    linears = len(gemms)
    return CastWork(
        bytes_fwd=fwd,
        bytes_bwd=bwd,
        kernels_fwd=linears * (TORCHAO_OPERAND_KERNELS + TORCHAO_WEIGHT_KERNELS[0]),
        kernels_bwd=linears * (TORCHAO_OPERAND_KERNELS + TORCHAO_WEIGHT_KERNELS[1]),
    )


def block_casts(
    fp8_casts: Fp8Casts, spec: ModelSpec, shard: Shard, transposes: bool = True, recipe: Fp8Recipe = "delayed"
) -> CastWork:
    """What `fp8_casts`'s quantization kernels add to one block's passes (nothing for "none");
    `recipe` is Transformer Engine's."""
    if fp8_casts == "transformer_engine":
        return te_block_casts(spec, shard, transposes, recipe)
    if fp8_casts == "torchao":
        return torchao_block_casts(spec, shard)
    return CastWork()
