"""The work inside each layer kind, as data: its GEMMs, its attention core and its
memory-bound (elementwise) traffic, at one tensor/context-parallel shard.

Layer kinds are "embedding" (word + position embedding), "transformer" (one block) and
"head" (final norm, LM head projection and cross-entropy). Everything is per micro-batch
of `mbs` sequences of `seq` tokens, on one GPU of a `tp`-way tensor-parallel and `cp`-way
context-parallel group. The FLOP counts follow Narayanan et al. 2021 (Megatron-LM, SC'21,
section 5.1) generalised to GQA and SwiGLU; a GEMM of (m x k) by (k x n) is 2*m*n*k FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

from planner.spec import ModelSpec

LAYER_KINDS = ("embedding", "transformer", "head")

LossPasses = Literal["fused", "vocab_parallel_fp32"]
LOSS_PASSES: tuple[str, ...] = get_args(LossPasses)
"""How the head's cross-entropy moves the logits: "fused" (one pass each way over the
vocab-parallel logits, `FUSED_CE_BYTES`) or "vocab_parallel_fp32" (Megatron-LM's
`_VocabParallelCrossEntropy` op by op on `logits.float()`, `VOCAB_PARALLEL_CE_BYTES`)."""
FUSED_CE_BYTES = (2 + 4 + 4, 4 + 2)
"""Bytes per logit element of a fused cross-entropy: forward reads the 16-bit logits, writes
and re-reads the fp32 softmax; backward reads the softmax and writes the 16-bit gradient."""
VOCAB_PARALLEL_CE_BYTES = (6 + 4 + 8 + 8 + 4 + 8, 8 + 6)
"""Bytes per logit element of Megatron-LM's loss as its code runs it, kernel by kernel:
`vocab_parallel_cross_entropy(output.float(), labels)` (megatron/model/gpt_model.py
`post_language_model_processing`, 2021; Megatron-DeepSpeed's `CrossEntropy` runs
`output.contiguous().float()`), then megatron/mpu/cross_entropy.py
`_VocabParallelCrossEntropy.forward`: the fp32 cast (read 2, write 4), `torch.max(dim=-1)`
(read 4), `sub_` of the max (read 4, write 4), `torch.exp(out=)` (read 4, write 4),
`sum(dim=-1)` (read 4), `div_` by the sum (read 4, write 4): 38 B; backward: `mul_` by the
loss gradient (read 4, write 4), then the cast's backward to 16 bits (read 4, write 2): 14 B.
The per-token gathers, masks and the three TP all-reduces of per-token values are left out.
megatron/core/tensor_parallel/cross_entropy.py runs the same passes today unless
`--cross-entropy-loss-fusion`."""
VOCAB_PARALLEL_CE_KERNELS = 14
"""Kernels of that loss, forward (the six passes above and eight per-token ops: target masks,
masked target, arange, gather, clone, masked fill, log, subtract)."""
FUSED_ROPE_BYTES = (4.0, 8.0)
"""Bytes per q and k element of a fused RoPE kernel: read and write it forward, twice that backward."""
UNFUSED_ROPE_KERNELS = (6, 8)
"""Kernels per rotated tensor of megatron-core's unfused RoPE (`unfused_rope_bytes`), forward and
backward, besides the cos and sin of the small frequency table."""
QK_NORM_KERNELS = (2, 2)
"""Kernels of QK-norm (Qwen3's q_norm and k_norm), forward and backward: one fused RMSNorm each
way on q and on k (as traced on planner/torch_blocks.py in presets/kernel_counts.toml)."""


def unfused_rope_bytes(rotary_percent: float) -> tuple[float, float]:
    """Bytes per q and k element, forward and backward, of megatron-core's RoPE without
    `apply_rope_fusion` (`apply_rotary_pos_emb_bshd`: `t, t_pass = t[..., :rot_dim],
    t[..., rot_dim:]`, `t = (t * cos_) + (_rotate_half(t) * sin_)`, `torch.cat((t, t_pass))`),
    op by op in bf16, at rotated share f: forward `t * cos_` 4f, `-x2` 2f, `_rotate_half`'s cat
    4f, `* sin_` 4f, the add 6f, the closing cat 4 (reads t and t_pass, writes q); backward the
    two products' gradients 4f each, the negation's 2f, chunk's gradient cat 4f, the sum of the
    two paths' gradients 6f, each slice's gradient written whole by `slice_backward` (read 2f,
    write 2; read 2(1 - f), write 2) and their sum 6: 20f + 12; at f = 1 the rotated slice is
    q itself and costs nothing backward: 20f + 8. Counted on megatron-core's own function by
    tests/cost/test_unfused_rope.py."""
    f = rotary_percent
    slices = 6 if f < 1 else 2
    return 20 * f + 4, 20 * f + slices + 6


class Gemm(NamedTuple):
    """One forward matrix multiply (m x k) @ (k x n), repeated `count` times."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """The shape of one micro-batch on one GPU."""

    mbs: int
    seq: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    ep: int = 1
    """Expert-parallel degree (MoE layers)."""
    etp: int | None = None
    """Expert tensor-parallel degree; None: equal to tp (Megatron's default)."""

    @property
    def local_tokens(self) -> int:
        """Tokens of the micro-batch this GPU's GEMMs see (sequence split over CP)."""
        return self.mbs * self.seq // self.cp

    @property
    def elementwise_tokens(self) -> float:
        """Tokens of the replicated (norm, residual) regions on this GPU: split over TP too
        under sequence parallelism."""
        return self.local_tokens / (self.tp if self.sequence_parallel else 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWork:
    """The forward work of one layer kind at one shard; the backward follows from it."""

    gemms: tuple[Gemm, ...]
    attention_flops: float
    """Forward FLOPs of the attention core (QK^T and AV) actually executed."""
    attention_seq: int
    """Query length of the attention core (for its small-shape efficiency)."""
    elementwise_bytes_fwd: float
    elementwise_bytes_bwd: float
    kernels_fwd: int
    """Kernel launches in the forward."""
    kernels_bwd: int | None = None
    """Kernel launches in the backward; None: twice the forward's."""
    attention_gemms: tuple[Gemm, ...] = ()
    """Unfused attention only: QK^T and PV as batched GEMMs (count = sequences x heads)."""
    attention_bytes_fwd: float = 0.0
    """Unfused attention only: HBM bytes of the softmax (and dropout) passes over the scores."""
    attention_bytes_bwd: float = 0.0
    attention_kernels: int = 0
    """Unfused attention only: kernels of those passes, each way."""

    @property
    def gemm_flops(self) -> float:
        return sum(g.flops for g in self.gemms)

    @property
    def backward_kernels(self) -> int:
        """Kernel launches in the backward (`kernels_bwd`, or twice the forward's)."""
        return 2 * self.kernels_fwd if self.kernels_bwd is None else self.kernels_bwd


def attention_head_dims(spec: ModelSpec) -> tuple[int, int]:
    """Per-head width of q and k, and of v: (d, d), or MLA's (nope + rope, v_head_dim)."""
    if spec.is_mla:
        return spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.v_head_dim
    return spec.kv_channels, spec.kv_channels


def attention_gemms(spec: ModelSpec, shard: Shard) -> list[Gemm]:
    """The forward projections of one block's attention on one TP shard. Latent attention
    (MLA) runs its down-projections replicated on every TP rank (Megatron-Core's
    MLASelfAttention) and splits the up-projections and the output by heads."""
    tokens, h, tp = shard.local_tokens, spec.hidden_size, shard.tp
    if spec.is_mla:
        heads = spec.num_attention_heads // tp
        qk, v = attention_head_dims(spec)
        rope, kv_rank = spec.qk_rope_head_dim, spec.kv_lora_rank
        if spec.q_lora_rank is None:
            q = [Gemm("q", tokens, heads * qk, h)]
        else:
            q = [Gemm("q_down", tokens, spec.q_lora_rank, h), Gemm("q_up", tokens, heads * qk, spec.q_lora_rank)]
        return [
            *q,
            Gemm("kv_down", tokens, kv_rank + rope, h),
            Gemm("kv_up", tokens, heads * (spec.qk_nope_head_dim + v), kv_rank),
            Gemm("attn_out", tokens, h, heads * v),
        ]
    d = spec.kv_channels
    q_width = spec.num_attention_heads * d
    kv_width = spec.num_kv_heads * d
    return [
        Gemm("qkv", tokens, (q_width + 2 * kv_width) // tp, h),
        Gemm("attn_out", tokens, h, q_width // tp),
    ]


def expert_tp(shard: Shard) -> int:
    """The expert tensor-parallel degree (Megatron defaults it to TP)."""
    return shard.etp or shard.tp


def moe_gemms(spec: ModelSpec, shard: Shard, imbalance: float = 1.0) -> tuple[Gemm, ...]:
    """Forward GEMMs of one MoE layer's MLP on the busiest GPU: the router, the grouped
    expert GEMMs (one per local expert, `count`), and the shared experts (split over TP)."""
    h, ep, etp = spec.hidden_size, shard.ep, expert_tp(shard)
    up = 2 if spec.activation == "swiglu" else 1
    ffn = spec.expert_ffn_hidden_size
    # routed rows: the plain (EP 1, ETP = TP) shape counts the TP group's tokens once
    routed = shard.local_tokens * spec.moe_top_k * ep * etp / (shard.tp * spec.num_experts)
    per_expert = max(1, round(routed * imbalance))
    local = spec.num_experts // ep
    gemms = [
        Gemm("router", shard.local_tokens, spec.num_experts, h),
        Gemm("expert_up", per_expert, up * ffn // etp, h, local),
        Gemm("expert_down", per_expert, h, ffn // etp, local),
    ]
    if spec.shared_ffn_width:
        shared = spec.shared_ffn_width
        gemms += [
            Gemm("shared_up", shard.local_tokens, up * shared // shard.tp, h),
            Gemm("shared_down", shard.local_tokens, h, shared // shard.tp),
        ]
    return tuple(gemms)


def transformer_gemms(
    spec: ModelSpec, shard: Shard, moe: bool | None = None, imbalance: float = 1.0
) -> tuple[Gemm, ...]:
    """The forward GEMMs of one transformer block on one TP shard: an MoE block (`moe`, the
    model's predominant block when unset) on its busiest expert-parallel rank."""
    tokens, h, tp = shard.local_tokens, spec.hidden_size, shard.tp
    gemms = attention_gemms(spec, shard)
    if spec.is_moe if moe is None else moe:
        return (*gemms, *moe_gemms(spec, shard, imbalance))
    up_factor = 2 if spec.activation == "swiglu" else 1
    ffn = spec.ffn_hidden_size
    gemms += [
        Gemm("mlp_up", tokens, up_factor * ffn // tp, h),
        Gemm("mlp_down", tokens, h, ffn // tp),
    ]
    return tuple(gemms)


def separate_matmuls(spec: ModelSpec, shard: Shard, fused_qkv: bool = False) -> tuple[Gemm, ...]:
    """The block's forward matmuls with one projection per matmul (q, k, v, out, gate, up,
    down for a SwiGLU block; one qkv matmul with `fused_qkv`, as torchtitan 0.3's Llama
    runs it), in the order a torch module runs them: the order a per-op checkpoint policy
    counts them in."""
    d, tp = spec.kv_channels, shard.tp
    swiglu = spec.activation == "swiglu"
    out: list[Gemm] = []
    for g in transformer_gemms(spec, shard):
        if g.name == "qkv" and not fused_qkv:
            q, kv = spec.num_attention_heads * d // tp, spec.num_kv_heads * d // tp
            out += [g._replace(name="q", n=q), g._replace(name="k", n=kv), g._replace(name="v", n=kv)]
        elif g.name.endswith("_up") and swiglu:
            out += [g._replace(name=g.name.replace("up", "gate"), n=g.n // 2), g._replace(n=g.n // 2)]
        else:
            out.append(g)
    return tuple(out)


def attention_core_flops(spec: ModelSpec, shard: Shard, flash: bool) -> float:
    """Forward FLOPs of QK^T and AV on one shard. A fused causal (flash) kernel skips the
    masked half: 2*b*s^2*a*d/(tp*cp); the unfused path computes the full square, twice that."""
    heads = spec.num_attention_heads // shard.tp
    qk, v = attention_head_dims(spec)
    full = 2.0 * shard.mbs * shard.seq * shard.seq * heads * (qk + v) / shard.cp
    return full / 2 if flash else full


TRITON_MIN_HEAD_BLOCK = 16
"""Smallest head-dimension tile of llm-foundry's Triton FlashAttention."""


def kernel_head_padding(spec: ModelSpec, attention: str) -> float:
    """Executed over counted attention-core FLOPs from the kernel's head-dimension tile. The
    Triton FlashAttention llm-foundry runs (attn_impl 'triton') pads each head to a power of
    two: `BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)` in `_flash_attn_forward` and
    `_flash_attn_backward` (llmfoundry/models/layers/flash_attn_triton.py, v0.3.0), its
    matmuls running over the padded width (MPT-30B's 112-wide heads as 128). Other kernels: 1."""
    if attention != "triton_fa1":
        return 1.0
    qk, v = attention_head_dims(spec)

    def block(d: int) -> int:
        return max(1 << (d - 1).bit_length(), TRITON_MIN_HEAD_BLOCK)

    return (block(qk) + block(v)) / (qk + v)


SOFTMAX_BYTES = (4, 6)
"""bf16 bytes per score element of the fused scale-mask-softmax (Megatron-LM's
FusedScaleMaskSoftmax, one kernel): forward reads the scores and writes the probabilities;
backward reads the probabilities and their gradient and writes the scores' gradient."""
DROPOUT_BYTES = (5, 5)
"""Attention dropout per score element: forward reads the probabilities, writes the output and
a 1-byte mask; backward reads the gradient and the mask and writes the gradient."""


def attention_passes(spec: ModelSpec, shard: Shard, dropout: bool) -> tuple[tuple[Gemm, ...], float, float, int]:
    """Unfused attention on one shard: its batched GEMMs (QK^T, then PV, over the full square),
    the forward and backward bytes of its memory-bound passes over the b * a * s^2 scores, and
    their kernels each way."""
    heads = spec.num_attention_heads // shard.tp
    q_len, d = shard.seq // shard.cp, spec.kv_channels
    batch = shard.mbs * heads
    gemms = (Gemm("scores", q_len, shard.seq, d, batch), Gemm("context", q_len, d, shard.seq, batch))
    scores = batch * q_len * shard.seq
    fwd, bwd = SOFTMAX_BYTES[0] * scores, SOFTMAX_BYTES[1] * scores
    if dropout:
        fwd, bwd = fwd + DROPOUT_BYTES[0] * scores, bwd + DROPOUT_BYTES[1] * scores
    return gemms, fwd, bwd, 1 + int(dropout)


def layer_work(
    spec: ModelSpec,
    kind: str,
    shard: Shard,
    *,
    attention: str = "flash2",
    dropout: bool = False,
    imbalance: float = 1.0,
    loss_passes: LossPasses = "fused",
    rope_fusion: bool = True,
) -> LayerWork:
    """The forward work of `kind` ("embedding", "transformer" or "head") at `shard`, its
    attention core run by `attention` (fused kernels, or "unfused") with or without dropout;
    an MoE block's on its busiest expert-parallel rank (`imbalance` x the mean tokens); the
    head's loss as `loss_passes` runs it; RoPE as one fused kernel or op by op (`rope_fusion`)."""
    if kind == "transformer":
        return _transformer_work(spec, shard, attention, dropout, imbalance, rope_fusion)
    if kind == "embedding":
        return _embedding_work(spec, shard)
    if kind == "head":
        return _head_work(spec, shard, loss_passes)
    raise ValueError(f"unknown layer kind {kind!r}; expected one of {LAYER_KINDS}")


def _transformer_work(
    spec: ModelSpec, shard: Shard, attention: str, dropout: bool, imbalance: float = 1.0, rope_fusion: bool = True
) -> LayerWork:
    h, tp = spec.hidden_size, shard.tp
    tokens, rep_tokens = shard.local_tokens, shard.elementwise_tokens
    ffn = spec.ffn_hidden_size
    if spec.is_moe:
        ffn = spec.expert_ffn_hidden_size * spec.moe_top_k * imbalance + spec.shared_ffn_width
    act_width = ffn // tp
    # bf16 bytes moved by the memory-bound kernels, forward: two norms (read x, write y),
    # two residual adds (read 2, write 1), QK-norm's two norms over q and k (read, write), RoPE
    # on q and k (fused: read, write), the activation function (SwiGLU reads 2 and writes 1 of
    # width ffn; GeLU and squared ReLU read 1, write 1).
    norm_and_residual = (2 * 2 + 2 * 3) * rep_tokens * h * 2
    if spec.is_mla:  # RoPE on the rotary part of each q head and on the one shared k part
        q_k_width = (spec.num_attention_heads / tp + 1) * spec.qk_rope_head_dim
    else:
        q_k_width = (spec.num_attention_heads + spec.num_kv_heads) * spec.kv_channels / tp
    qk_norm = 2 * 2 * tokens * q_k_width if spec.qk_norm else 0.0
    qk_norm_kernels = QK_NORM_KERNELS if spec.qk_norm else (0, 0)
    has_rope = spec.position_embedding == "rope"
    if not rope_fusion and spec.is_mla:
        raise ValueError("unfused RoPE is priced for megatron-core's standard attention, not MLA")
    rope_fwd, rope_bwd = FUSED_ROPE_BYTES if rope_fusion else unfused_rope_bytes(spec.rotary_percent)
    rope_kernels = (0, 0) if rope_fusion or not has_rope else tuple(2 * (k - 1) for k in UNFUSED_ROPE_KERNELS)
    rope_elements = tokens * q_k_width if has_rope else 0.0
    act = (3 if spec.activation == "swiglu" else 2) * tokens * act_width * 2
    fwd_bytes = norm_and_residual + qk_norm + act
    flash = attention != "unfused"
    unfused = attention_passes(spec, shard, dropout) if not flash else ((), 0.0, 0.0, 0)
    return LayerWork(
        gemms=transformer_gemms(spec, shard, imbalance=imbalance),
        attention_flops=attention_core_flops(spec, shard, flash) * kernel_head_padding(spec, attention),
        attention_seq=shard.seq // shard.cp,
        elementwise_bytes_fwd=fwd_bytes + rope_elements * rope_fwd,
        elementwise_bytes_bwd=2 * fwd_bytes + rope_elements * rope_bwd,
        kernels_fwd=14 + rope_kernels[0] + qk_norm_kernels[0],
        kernels_bwd=28 + rope_kernels[1] + qk_norm_kernels[1],
        attention_gemms=unfused[0],
        attention_bytes_fwd=unfused[1],
        attention_bytes_bwd=unfused[2],
        attention_kernels=unfused[3],
    )


def _embedding_work(spec: ModelSpec, shard: Shard) -> LayerWork:
    h = spec.hidden_size
    # gather rows (read + write), plus the position add; backward scatter-adds into the
    # fp32 gradient of the (vocab-parallel) table.
    fwd = shard.local_tokens * h * 2 * (2 + (3 if spec.position_embedding == "learned" else 0))
    bwd = shard.local_tokens * h * (2 + 4 + 4)
    return LayerWork(
        gemms=(),
        attention_flops=0.0,
        attention_seq=shard.seq // shard.cp,
        elementwise_bytes_fwd=fwd,
        elementwise_bytes_bwd=bwd,
        kernels_fwd=3,
    )


def _head_work(spec: ModelSpec, shard: Shard, loss_passes: LossPasses = "fused") -> LayerWork:
    h, tokens = spec.hidden_size, shard.local_tokens
    vocab_shard = spec.vocab_size / shard.tp
    # final norm, then cross-entropy over the vocab-parallel logits (FUSED_CE_BYTES or
    # VOCAB_PARALLEL_CE_BYTES per logit element).
    norm = 2 * shard.elementwise_tokens * h * 2
    if loss_passes not in LOSS_PASSES:
        raise ValueError(f"loss_passes must be one of {LOSS_PASSES}, got {loss_passes!r}")
    op_by_op = loss_passes == "vocab_parallel_fp32"
    ce_fwd, ce_bwd = VOCAB_PARALLEL_CE_BYTES if op_by_op else FUSED_CE_BYTES
    return LayerWork(
        gemms=(Gemm("lm_head", tokens, int(vocab_shard), h),),
        attention_flops=0.0,
        attention_seq=shard.seq // shard.cp,
        elementwise_bytes_fwd=norm + tokens * vocab_shard * ce_fwd,
        elementwise_bytes_bwd=2 * norm + tokens * vocab_shard * ce_bwd,
        kernels_fwd=2 + VOCAB_PARALLEL_CE_KERNELS if op_by_op else 6,
    )


def model_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """Training FLOPs per token used for MFU (PaLM, Chowdhery et al. 2022, appendix B):
    6 * N_matmul + 12 * L * (a * d) * seq, where N_matmul counts the weights that take part
    in a matmul (all but the input embedding tables; MoE: the active experts only) and the
    attention term counts QK^T and AV over the full (not causally halved) square."""
    shard = Shard(mbs=1, seq=seq)
    kinds = [spec.is_moe_layer(i) for i in range(spec.num_layers)]
    blocks = sum(
        kinds.count(moe) * sum(g.flops for g in transformer_gemms(spec, shard, moe)) / seq for moe in set(kinds)
    )
    head = 2.0 * spec.hidden_size * spec.vocab_size
    qk, v = attention_head_dims(spec)
    attention = 6.0 * spec.num_layers * spec.num_attention_heads * (qk + v) * seq
    return 3.0 * (blocks + head) + attention
