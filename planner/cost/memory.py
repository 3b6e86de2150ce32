"""Memory per GPU: parameters, gradients, optimizer states, activations, allowance.

Activations are the tensors each layer saves for its backward, per micro-batch, listed
one by one (`saved_tensors`) so that tensor and sequence parallelism and recomputation act
on each the way Megatron-LM applies them. For the GPT layer without flash attention the
sum is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), Table 2: s*b*h*(34 + 5*a*s/h) bytes without parallelism, s*b*h*(10 + 24/t +
5*a*s/(h*t)) with t-way TP, s*b*h/t*(34 + 5*a*s/h) with sequence parallelism, 34*s*b*h/t
with selective recompute and 2*s*b*h (/t with SP) with full recompute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

from planner.cost.shapes import Shard, separate_matmuls
from planner.spec import ModelSpec
from planner.units import GiB, MiB

BYTES_BF16 = 2
BYTES_FP32 = 4


class SavedTensor(NamedTuple):
    """One tensor a layer keeps for its backward, for one micro-batch on one GPU."""

    name: str
    bytes: float
    recompute: str
    """"keep": saved under no and selective recompute; else the Megatron-LM recompute module
    (`RECOMPUTE_MODULES`) whose selective recompute drops it: "core_attn" (the unfused attention
    core), "layernorm" (the norms' outputs), "mla_up_proj" (MLA's up-projections and RoPE),
    "moe_act" (the routed experts' activation output)."""


RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "moe_act"]
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
"""Megatron-LM's `--recompute-modules` that drop saved tensors of the block as the planner
lists them (megatron/core/transformer/transformer_config.py, `recompute_modules`: "core_attn":
recompute the core attention part; "layernorm": the input_layernorm and pre_mlp_layernorm;
"mla_up_proj": the MLA up projection and RoPE applying parts; "moe_act": the MoE MLP activation
function; default ["core_attn"]). "layernorm", "mla_up_proj" and "moe_act" use output-discarding
checkpointing (CheckpointWithoutOutput): the module's input stays saved, its output is dropped
and recomputed before the backward that needs it."""

ActivationStorage = Literal["default", "deepseek_fp8"]
ACTIVATION_STORAGE: tuple[str, ...] = get_args(ActivationStorage)
"""How saved activations are stored. "default": bf16, except that under FP8 GEMMs
(Transformer Engine) every Linear keeps its own FP8 copy of its input (`fp8_linear_inputs`).
"deepseek_fp8": DeepSeek-V3's (arXiv 2412.19437, section 3.3.3, "Low-Precision Activation"):
Linear inputs cached in FP8 with one fp32 scale per 1x128 tile; the input of the Linear after
the attention operator (also the attention backward's output tensor) as one E5M6 tensor; the
SwiGLU input in FP8; the tokens dispatched to the experts quantised to FP8 before the dispatch
(section 3.3.3, "Low-Precision Communication")."""

FP8_BYTES = 1
E5M6_BYTES = 1.5
"""DeepSeek-V3's customised format for the attention output: 1 sign, 5 exponent, 6 mantissa
bits, 12 bits an element (section 3.3.3)."""
TILE_SCALE_BYTES = 4 / 128
"""DeepSeek-V3's fine-grained quantisation: one fp32 scaling factor per 1x128 tile of an
activation (section 3.3.2, "Fine-Grained Quantization"), 4/128 bytes an element."""


SelectivePolicy = Literal["core_attention", "every_other_matmul"]
SELECTIVE_POLICIES: tuple[str, ...] = get_args(SelectivePolicy)
"""What `selective` recompute means in the runtime: Megatron-LM's core-attention recompute,
or torchtitan's per-op checkpointing (`SelectiveAC`), which saves the attention op's and every
other matmul's output and recomputes the rest of the block."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationOptions:
    flash_attention: bool = True
    dropout: bool = False
    selective_policy: SelectivePolicy = "core_attention"
    moe_imbalance: float = 1.0
    """Busiest expert-parallel rank's routed tokens over the mean (planner/cost/moe.py)."""
    recompute_modules: frozenset[str] = frozenset({"core_attn"})
    """What selective recompute drops under the core-attention policy (`RECOMPUTE_MODULES`):
    Megatron-LM's `--recompute-modules`, default core_attn."""
    fp8_linear_inputs: bool = False
    """Under FP8 GEMMs each Linear saves its input as an FP8 copy, 1 byte an element, beside any
    bf16 tensor another op keeps. Transformer Engine 2.x, pytorch/module/linear.py forward:
    `inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)` ("Discard row-wise data
    since it is not needed in backward pass"), then `saved_inputmat = inputmat`; row-wise instead
    of column-wise when sequence parallelism must all-gather it; one FP8 copy either way.
    layernorm_linear.py likewise keeps `ln_out` (FP8) beside the norm's bf16 input, and
    grouped_linear.py (the experts' GEMMs) each GEMM's input the same way. TE 1.x saved either
    `inputmat` or `inputmat_t` (FP8), never both."""
    fp8_swiglu_input: bool = False
    """The SwiGLU input stored in FP8 (Megatron-LM's `activation_func_fp8_input_store`: "Store
    the input of MLP activation function in FP8 for backprop to save memory"; DeepSeek-V3)."""
    attention_output_bytes: float | None = None
    """Bytes an element of the attention output when one tensor serves both the attention
    backward and the output projection's (DeepSeek-V3's E5M6: 1.5); None: the attention keeps
    its bf16 output and the projection its own input (an FP8 copy under `fp8_linear_inputs`)."""
    fp8_scale_bytes: float = 0.0
    """Scale bytes per FP8-stored element (`TILE_SCALE_BYTES` for 1x128 tiles; TE's per-tensor
    scales are negligible: 0)."""
    sac_fused_qkv: bool = True
    """Under torchtitan's per-op policy the q, k, v projections are one matmul (torchtitan 0.3's
    fused wqkv) or three (wq, wk, wv: torchtitan's Llama of 2024); it decides which outputs the
    every-other-matmul rule keeps."""
    eager_swiglu: bool = False
    """SwiGLU run op by op, `w2(silu(w1 x) * w3 x)` (torchtitan's FeedForward without
    torch.compile): the multiply keeps silu's output as well, one more FFN-wide tensor. A
    fused kernel (Megatron-LM's bias_swiglu, Transformer Engine, an inductor-compiled
    region) keeps only w1 x and w3 x and recomputes silu in backward. Measured: torchtitan
    0.3's Llama3TransformerBlock keeps exactly this tensor more (tests/profile/test_blocks.py)."""


def saved_tensors(
    spec: ModelSpec, kind: str, shard: Shard, options: ActivationOptions = ActivationOptions()
) -> list[SavedTensor]:
    """The tensors `kind` saves for backward with no recomputation, on one GPU."""
    if kind == "transformer":
        return _transformer_saved(spec, shard, options)
    h, rep = spec.hidden_size, shard.elementwise_tokens
    if kind == "embedding":
        mask = [SavedTensor("dropout_mask", rep * h, "keep")] if options.dropout else []
        ids = [SavedTensor("token_ids", shard.local_tokens * 8, "keep")]
        if spec.position_embedding == "learned":
            ids.append(SavedTensor("position_ids", shard.local_tokens * 8, "keep"))
        if spec.embedding_norm:  # LayerNorm saves its input, mean and rstd (BLOOM's embed-layernorm)
            ids += [
                SavedTensor("embedding_norm_input", BYTES_BF16 * rep * h, "keep"),
                SavedTensor("embedding_norm_stats", 2 * BYTES_FP32 * rep, "keep"),
            ]
        return [*ids, *mask]
    if kind == "head":
        return [
            SavedTensor("final_norm_input", BYTES_BF16 * rep * h, "keep"),
            SavedTensor("lm_head_input", BYTES_BF16 * rep * h, "keep"),
            SavedTensor("softmax_fp32", BYTES_FP32 * shard.local_tokens * spec.vocab_size / shard.tp, "keep"),
        ]
    raise ValueError(f"unknown layer kind {kind!r}")


def activation_options_for(storage: str, fp8_gemms: bool, **fields) -> ActivationOptions:
    """The ActivationOptions of a runtime: `storage` (`ACTIVATION_STORAGE`) and whether its
    GEMMs run in FP8 (then Linear inputs are saved in FP8), with the other `fields` as given."""
    if storage == "deepseek_fp8":
        return ActivationOptions(
            fp8_linear_inputs=True,
            fp8_swiglu_input=True,
            attention_output_bytes=E5M6_BYTES,
            fp8_scale_bytes=TILE_SCALE_BYTES,
            **fields,
        )
    if storage != "default":
        raise ValueError(f"activation_storage must be one of {ACTIVATION_STORAGE}, got {storage!r}")
    return ActivationOptions(fp8_linear_inputs=fp8_gemms, **fields)


CrossEntropy = Literal["fused", "eager_fp32"]
CROSS_ENTROPY: tuple[str, ...] = get_args(CrossEntropy)
"""How the runtime computes the loss over the logits: Megatron-LM's vocab-parallel cross-entropy
("fused": the fp32 softmax is computed and turned into its gradient in place), or eager PyTorch's
`F.cross_entropy(logits.float(), labels)` ("eager_fp32": torchtitan's loss)."""


def loss_transient_bytes(spec: ModelSpec, shard: Shard, dtype_bytes: int, cross_entropy: CrossEntropy) -> float:
    """Bytes the loss holds beside its saved fp32 softmax at its peak, one micro-batch.

    fused (megatron/core/tensor_parallel/cross_entropy.py): the logits in the model dtype beside
    the fp32 softmax the forward builds from them in place and saves; the backward turns that
    saved softmax into the gradient in place (`grad_input = softmax`, then `mul_`), no new buffer.

    eager_fp32 (`cross_entropy(pred.float(), labels)`: log_softmax then nll_loss): the forward
    holds the dtype logits and their fp32 copy while log_softmax writes its (saved) fp32 output,
    dtype + 4 bytes per logit; the backward's nll_loss_backward writes a dense fp32 gradient of
    the logits' shape and log_softmax_backward_data a second one while the saved output is still
    alive, 4 + 4 bytes per logit (the dtype logits were freed: torchtitan's train step `del pred`
    before backward). The larger of the two is the peak."""
    logits = shard.local_tokens * spec.vocab_size / shard.tp
    if cross_entropy == "fused":
        return dtype_bytes * logits
    if cross_entropy == "eager_fp32":
        return max(dtype_bytes + BYTES_FP32, 2 * BYTES_FP32) * logits
    raise ValueError(f"cross_entropy must be one of {CROSS_ENTROPY}, got {cross_entropy!r}")


def _transformer_saved(spec: ModelSpec, shard: Shard, options: ActivationOptions) -> list[SavedTensor]:
    h, tp, d = spec.hidden_size, shard.tp, spec.kv_channels
    tokens, rep = shard.local_tokens, shard.elementwise_tokens
    heads = spec.num_attention_heads / tp
    kv_heads = max(spec.num_kv_heads / tp, 1)
    bf16 = BYTES_BF16
    fp8 = FP8_BYTES + options.fp8_scale_bytes
    linear = fp8 if options.fp8_linear_inputs else bf16  # what a Linear keeps of its input
    norm_out = "layernorm"  # a norm's output (a Linear's input) is dropped by that recompute module
    saved = [
        SavedTensor("attn_norm_input", bf16 * rep * h, "keep"),
        SavedTensor("qkv_input", linear * rep * h, norm_out),
    ]
    if spec.is_mla:  # the compressed q and kv (replicated over TP), normed into the up-projections, then q, k, v
        qk, v = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.v_head_dim
        latents = (spec.q_lora_rank or 0) + spec.kv_lora_rank + spec.qk_rope_head_dim
        saved += [
            SavedTensor("mla_latents", bf16 * tokens * latents, "keep"),
            SavedTensor("mla_up_proj_inputs", linear * tokens * latents, "mla_up_proj"),
            SavedTensor("q_k_v", bf16 * tokens * heads * (2 * qk + v), "mla_up_proj"),
        ]
        d = v  # the attention output's per-head width
    else:
        saved.append(SavedTensor("q_k_v", bf16 * tokens * (heads + 2 * kv_heads) * d, "keep"))
        if spec.qk_norm:  # QK-norm's two RMSNorms keep their inputs (q, k) and an fp32 1/rms per head
            saved.append(SavedTensor("qk_norm_inputs", (bf16 * d + BYTES_FP32) * tokens * (heads + kv_heads), "keep"))
    attn_out = tokens * heads * d
    if options.flash_attention:
        saved.append(SavedTensor("softmax_lse", BYTES_FP32 * tokens * heads, "keep"))
    else:
        scores = shard.mbs * heads * (shard.seq / shard.cp) * shard.seq
        saved.append(SavedTensor("softmax_output", bf16 * scores, "core_attn"))
        if options.dropout:
            saved += [
                SavedTensor("softmax_dropout_mask", scores, "core_attn"),
                SavedTensor("softmax_dropout_output", bf16 * scores, "core_attn"),
            ]
    if options.attention_output_bytes is not None:  # one tensor for both backwards (DeepSeek's E5M6)
        saved.append(SavedTensor("attn_output", options.attention_output_bytes * attn_out, "keep"))
    else:
        saved.append(SavedTensor("attn_output", bf16 * attn_out, "keep"))
        if options.fp8_linear_inputs:  # the output projection's own FP8 copy of its input
            saved.append(SavedTensor("proj_input", linear * attn_out, "keep"))
    if options.dropout:
        saved.append(SavedTensor("attn_dropout_mask", rep * h, "keep"))
    saved.append(SavedTensor("mlp_norm_input", bf16 * rep * h, "keep"))
    swiglu_in = fp8 if options.fp8_swiglu_input else bf16
    if spec.is_moe:
        saved += _moe_saved(spec, shard, options, linear, swiglu_in)
    else:
        saved.append(SavedTensor("mlp_input", linear * rep * h, norm_out))
        saved += _mlp_saved(spec, "", tokens * spec.ffn_hidden_size / tp, options, linear, swiglu_in, "keep")
    if options.dropout:
        saved.append(SavedTensor("mlp_dropout_mask", rep * h, "keep"))
    return saved


def _mlp_saved(
    spec: ModelSpec,
    prefix: str,
    elements: float,
    options: ActivationOptions,
    linear: float,
    swiglu_in: float,
    output_recompute: str,
) -> list[SavedTensor]:
    """What an MLP of `elements` FFN-wide values (tokens x width on this GPU) keeps between its
    two Linears: the activation's input (fc1's output) and its output (fc2's input, dropped by
    `output_recompute`)."""
    if spec.activation == "swiglu":
        saved = [
            SavedTensor(f"{prefix}gate_and_up", 2 * swiglu_in * elements, "keep"),
            SavedTensor(f"{prefix}swiglu_output", linear * elements, output_recompute),
        ]
        if options.eager_swiglu:
            saved.append(SavedTensor(f"{prefix}silu_output", BYTES_BF16 * elements, output_recompute))
        return saved
    return [
        SavedTensor(f"{prefix}gelu_input", BYTES_BF16 * elements, "keep"),
        SavedTensor(f"{prefix}gelu_output", linear * elements, output_recompute),
    ]


def _moe_saved(
    spec: ModelSpec, shard: Shard, options: ActivationOptions, linear: float, swiglu_in: float
) -> list[SavedTensor]:
    """An MoE layer's saved tensors on the busiest EP rank, as Megatron-Core's alltoall
    dispatcher and TEGroupedMLP keep them (megatron/core/transformer/moe/): the router's input
    (the pre-MLP norm's output, held in bf16 by the gating GEMM, `router_gating_linear`) and its
    fp32 scores; the routed copies that arrive at this rank, saved once as the grouped fc1's
    input (permute, all-to-all and sort_chunks_by_idxs keep only indices and split sizes); fc1's
    output, kept by the activation, which also applies the routing probabilities
    (`weighted_bias_swiglu_impl(..., permuted_probs, ...)` in TEGroupedMLP.forward, so the
    combine's `unpermute` is called without probs and keeps no expert output); the activation's
    output as fc2's input (dropped by "moe_act"); the shared experts as a dense MLP."""
    h, tp, tokens = spec.hidden_size, shard.tp, shard.local_tokens
    routed = tokens * spec.moe_top_k * options.moe_imbalance  # copies on the busiest rank
    saved = [
        SavedTensor("router_input", BYTES_BF16 * shard.elementwise_tokens * h, "layernorm"),
        SavedTensor("router_probs", BYTES_FP32 * tokens * spec.num_experts, "keep"),
        SavedTensor("dispatched_tokens", linear * routed * h / tp, "keep"),
        SavedTensor("expert_probs", BYTES_FP32 * routed / tp, "keep"),
    ]
    saved += _mlp_saved(
        spec, "expert_", routed * spec.expert_ffn_hidden_size / tp, options, linear, swiglu_in, "moe_act"
    )
    if spec.shared_ffn_width:
        if options.fp8_linear_inputs:  # the shared fc1's FP8 copy beside the router's bf16 input
            saved.append(SavedTensor("shared_input", linear * shard.elementwise_tokens * h, "layernorm"))
        saved += _mlp_saved(spec, "shared_", tokens * spec.shared_ffn_width / tp, options, linear, swiglu_in, "keep")
    return saved


def activation_bytes(
    spec: ModelSpec,
    kind: str,
    shard: Shard,
    recompute: str,
    options: ActivationOptions = ActivationOptions(),
) -> float:
    """Bytes `kind` holds for backward per micro-batch, under `recompute`:
    "none" keeps every saved tensor, "selective" drops the unfused attention core's
    (Megatron's core-attention recompute) or keeps what `every_other_matmul_saved` lists
    (torchtitan's per-op policy), "full" keeps only each block's input."""
    if kind == "transformer" and recompute == "selective" and options.selective_policy == "every_other_matmul":
        return every_other_matmul_saved(spec, shard, options.sac_fused_qkv)
    saved = saved_tensors(spec, kind, shard, options)
    if kind != "transformer" or recompute == "none":
        return sum(t.bytes for t in saved)
    if recompute == "selective":
        return sum(t.bytes for t in saved if t.recompute not in options.recompute_modules)
    if recompute == "full":
        return BYTES_BF16 * shard.elementwise_tokens * spec.hidden_size
    raise ValueError(f"unknown recompute mode {recompute!r}")


TORCHTITAN_FUSED_QKV = True
"""torchtitan 0.3 builds its Llama attention with `fuse_qkv=True` (one wqkv matmul; the
torchtitan exporter writes the same), so its per-op policy counts q, k and v as one matmul."""


def every_other_matmul_saved(spec: ModelSpec, shard: Shard, fused_qkv: bool = TORCHTITAN_FUSED_QKV) -> float:
    """Bytes a block keeps under torchtitan's per-op checkpointing (`SelectiveAC`): its input,
    the outputs of its 1st, 3rd, 5th... matmul (fused qkv, gate, down for a SwiGLU block) and
    the attention op's output and log-sum-exp; everything else is recomputed. Measured on
    torchtitan's own block and policy by tests/cost/test_selective_policy.py. With three
    (`fused_qkv` False: torchtitan's 2024 Llama) it keeps q and v and recomputes k."""
    matmuls = separate_matmuls(spec, shard, fused_qkv=fused_qkv)
    heads = spec.num_attention_heads / shard.tp
    attention = (BYTES_BF16 * spec.kv_channels + BYTES_FP32) * shard.local_tokens * heads
    block_input = BYTES_BF16 * shard.elementwise_tokens * spec.hidden_size
    return block_input + sum(BYTES_BF16 * g.m * g.n * g.count for g in matmuls[0::2]) + attention


def attention_param_count(spec: ModelSpec, tp: int = 1) -> float:
    """Parameters of one block's attention (projections, biases and QK-norm's two head_dim-wide
    weights, replicated) on one of `tp` GPUs. KV heads are replicated when there are fewer of
    them than TP ranks (as Megatron does). Latent attention (MLA) splits its up-projections and
    output by heads and replicates its down-projections and their norms (Megatron-Core's
    MLASelfAttention)."""
    h, d = spec.hidden_size, spec.kv_channels
    if spec.is_mla:
        heads = spec.num_attention_heads / tp
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q = (
            h * heads * qk
            if spec.q_lora_rank is None
            else (h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * heads * qk)
        )
        kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank
        kv += spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        return q + kv + heads * spec.v_head_dim * h
    q_width = spec.num_attention_heads * d / tp
    kv_width = max(spec.num_kv_heads / tp, 1) * d
    attn = h * (q_width + 2 * kv_width) + q_width * h
    if spec.qkv_bias:
        attn += q_width + 2 * kv_width
    if spec.linear_bias:
        attn += h
    if spec.qk_norm:
        attn += 2 * d
    return attn


def routed_expert_param_count(spec: ModelSpec, ep: int = 1, etp: int = 1, experts: int | None = None) -> float:
    """Parameters of the routed experts of one MoE layer on one GPU: `experts` of them (all
    when unset) spread over `ep` expert-parallel ranks, each split `etp` ways."""
    up = 2 if spec.activation == "swiglu" else 1
    count = spec.num_experts if experts is None else experts
    return count * (up + 1) * spec.hidden_size * spec.expert_ffn_hidden_size / (ep * etp)


def mlp_param_count(
    spec: ModelSpec, tp: int = 1, moe: bool = False, ep: int = 1, etp: int | None = None, active: bool = False
) -> float:
    """Parameters of one block's MLP on one GPU: dense (split over `tp`), or an MoE layer's
    router (replicated), shared experts (split over `tp`, their gate replicated) and routed
    experts (over `ep` x `etp`, `etp` = `tp` when unset); with `active`, only the top-k experts
    a token runs."""
    h, up = spec.hidden_size, 2 if spec.activation == "swiglu" else 1
    if not moe:
        ffn = spec.ffn_hidden_size / tp
        return (up + 1) * h * ffn + ((up * ffn + h) if spec.linear_bias else 0.0)
    experts = spec.moe_top_k if active else None
    routed = routed_expert_param_count(spec, 1 if active else ep, 1 if active else (etp or tp), experts)
    if active:
        routed /= tp
    gate = h if spec.moe_shared_expert_gate else 0.0
    return routed + h * spec.num_experts + (up + 1) * h * spec.shared_ffn_width / tp + gate


def transformer_param_count(
    spec: ModelSpec, tp: int = 1, ep: int = 1, etp: int | None = None, moe: bool | None = None
) -> float:
    """Parameters of one transformer block held by one GPU of a `tp`-way tensor-parallel
    group; an MoE block (`moe`, the model's predominant block when unset) holds its routed
    experts split over `ep` x `etp` (`etp` = `tp` when unset, Megatron's default)."""
    norm = (2 if spec.norm == "layernorm" else 1) * spec.hidden_size
    moe = spec.is_moe if moe is None else moe
    return attention_param_count(spec, tp) + mlp_param_count(spec, tp, moe, ep, etp) + 2 * norm


def active_param_count(spec: ModelSpec) -> float:
    """Parameters one token runs through: every weight but the routed experts it is not sent
    to (the input embedding counted, as model cards do)."""
    norm = (2 if spec.norm == "layernorm" else 1) * spec.hidden_size
    blocks = sum(
        attention_param_count(spec) + 2 * norm + mlp_param_count(spec, moe=spec.is_moe_layer(i), active=True)
        for i in range(spec.num_layers)
    )
    return blocks + embedding_param_count(spec) + head_param_count(spec, shares_rank_with_embedding=True)


def mtp_param_count(spec: ModelSpec) -> float:
    """Parameters of the multi-token-prediction modules beyond those shared with the model
    (embedding and head): per module three norms (the embedding's and the hidden state's
    before the projection, the output's before the shared head), the 2h x h projection and one
    MoE block."""
    norm = (2 if spec.norm == "layernorm" else 1) * spec.hidden_size
    per_module = 3 * norm + 2 * spec.hidden_size**2 + transformer_param_count(spec, moe=spec.is_moe)
    return spec.mtp_depth * per_module


def embedding_param_count(spec: ModelSpec, tp: int = 1) -> float:
    """Parameters of the (vocab-parallel) embedding on one TP rank, positions included."""
    params = spec.vocab_size * spec.hidden_size / tp
    if spec.position_embedding == "learned":
        params += spec.max_position_embeddings * spec.hidden_size
    if spec.embedding_norm:
        params += (2 if spec.norm == "layernorm" else 1) * spec.hidden_size
    return params


def head_param_count(spec: ModelSpec, tp: int = 1, shares_rank_with_embedding: bool = False) -> float:
    """Parameters of the final norm and LM head on one TP rank. A tied head on the same
    rank as the embedding adds no weights; on another pipeline rank it holds a copy."""
    norm = (2 if spec.norm == "layernorm" else 1) * spec.hidden_size
    if spec.tie_embeddings and shares_rank_with_embedding:
        return norm
    return norm + spec.vocab_size * spec.hidden_size / tp


def total_param_count(spec: ModelSpec) -> float:
    """All parameters of the model, counted once (multi-token prediction aside: `mtp_param_count`)."""
    blocks = sum(transformer_param_count(spec, moe=spec.is_moe_layer(i)) for i in range(spec.num_layers))
    return blocks + embedding_param_count(spec) + head_param_count(spec, shares_rank_with_embedding=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter of the training state on one GPU."""

    weights: float
    grads: float
    optimizer: float


def expert_dp_shards(tp: int, cp: int, dp: int, ep: int, etp: int) -> int:
    """Expert data-parallel ranks (EDP) of Megatron's MoE parallel folding: the TP x CP x DP
    ranks over ETP x EP."""
    return max(1, tp * cp * dp // (ep * etp))


def state_bytes_per_param(zero_stage: int, dp_shards: int) -> StateBytes:
    """Mixed-precision Adam: bf16 weights (2 B), fp32 gradient accumulation buffer (4 B),
    fp32 master weights and the two Adam moments (12 B); Megatron-LM's distributed optimizer
    docs give 18 B/param unsharded and 6 + 12/d sharded. ZeRO-1 (distributed optimizer)
    shards the 12 B over the `dp_shards` data-parallel ranks; ZeRO-2 also the gradients;
    ZeRO-3 / FSDP keeps fp32 weights, fp32 gradients and the moments, all sharded."""
    d = dp_shards
    if zero_stage == 0:
        return StateBytes(weights=2, grads=4, optimizer=12)
    if zero_stage == 1:
        return StateBytes(weights=2, grads=4, optimizer=12 / d)
    if zero_stage == 2:
        return StateBytes(weights=2, grads=4 / d, optimizer=12 / d)
    if zero_stage == 3:
        return StateBytes(weights=4 / d, grads=4 / d, optimizer=8 / d)
    raise ValueError(f"zero_stage must be 0..3, got {zero_stage}")


CUDA_CONTEXT_BYTES = 0.5 * GiB
"""CUDA context and lazily loaded kernel images, outside the caching allocator. NCCL issue #1685
(8 x H100) reports 1.06 GB of device memory outside PyTorch's allocator with one communicator
connected; less that communicator's ring buffers (`NCCL_COLLECTIVE_COMM_BYTES`, 0.625 GiB)
leaves about 0.4 GiB; we charge 0.5 GiB, the usual order of a CUDA 12 context on Hopper."""
NCCL_CHANNELS = 32
"""Channels NCCL opens per communicator between H100s over NVLink (NCCL issue #1685,
NCCL_DEBUG=INFO: channels 00..31 per pair of GPUs); memory grows linearly with them
(NCCL issue #986, S. Jeaugey)."""
NCCL_CONNECTION_BYTES = 10 * MiB
"""Buffers per channel and peer connection: NCCL_BUFFSIZE (4 MiB, Simple protocol; NCCL env
docs) plus the LL128 and LL buffers, 10,485,760 B per connection in NCCL_DEBUG_SUBSYS=ALLOC
(NCCL issue #1685)."""
NCCL_RING_PEERS = 2
"""A ring connects each rank to its previous and next peer, whatever the group size (NCCL
issue #986)."""
NCCL_COLLECTIVE_COMM_BYTES = NCCL_CHANNELS * NCCL_RING_PEERS * NCCL_CONNECTION_BYTES
"""One communicator that runs collectives (TP, CP, DP, the tied embedding's group): 640 MiB."""
NCCL_P2P_CHANNELS = 2
"""Channels per peer for send/recv (NCCL_NCHANNELS_PER_NET_PEER, default 2; NCCL env docs)."""
NCCL_P2P_COMM_BYTES = NCCL_P2P_CHANNELS * NCCL_RING_PEERS * NCCL_CONNECTION_BYTES
"""The pipeline's send/recv communicator (previous and next stage): 40 MiB."""
CUBLAS_WORKSPACE_BYTES = 32 * MiB
"""cuBLAS workspace per handle and stream, taken from the caching allocator and never freed:
32 MiB on Hopper and Blackwell, 8.125 MiB before (`getChosenWorkspaceSize`,
aten/src/ATen/cuda/CublasHandlePool.cpp; PyTorch docs, CUBLAS_WORKSPACE_CONFIG); we charge 32."""
FRAGMENTATION = 0.05
"""Caching-allocator overhead, reserved minus allocated, as a fraction of the tensors it holds:
block rounding (512 B below 1 MiB, 2 MiB segments for small blocks, 20 MiB segments for 1-10
MiB, larger ones rounded up to 2 MiB: kMinBlockSize, kSmallBuffer, kLargeBuffer, kRoundLarge in
c10/cuda/CUDACachingAllocator.cpp) and blocks freed in one size and not reusable for the next
(activations of varying sizes). An assumed figure, not a measured one: no component-level
source gives it for training; the rounding alone is under 1 MiB per large tensor."""


def communicator_bytes(tp: int, cp: int, dp: int, pp: int, embedding_group: bool = False) -> float:
    """NCCL buffers of one GPU's communicators: one per parallel group with more than one rank
    that runs collectives (TP, CP, the data-parallel gradient group DP x CP, the tied
    embedding's first-last stage group), plus the pipeline's send/recv."""
    collective = (tp > 1) + (cp > 1) + (dp * cp > 1) + embedding_group
    return collective * NCCL_COLLECTIVE_COMM_BYTES + (NCCL_P2P_COMM_BYTES if pp > 1 else 0.0)


def outside_allocator_bytes(
    tp: int, cp: int, dp: int, pp: int, embedding_group: bool = False, context_bytes: float = CUDA_CONTEXT_BYTES
) -> float:
    """Device memory the caching allocator does not report: CUDA context (`context_bytes`,
    CostOptions.memory.cuda_context_bytes) and NCCL buffers."""
    return context_bytes + communicator_bytes(tp, cp, dp, pp, embedding_group)


def allocator_overhead_bytes(tensor_bytes: float) -> float:
    """Reserved minus the tensors' bytes: fragmentation and rounding, plus the cuBLAS workspace."""
    return CUBLAS_WORKSPACE_BYTES + FRAGMENTATION * tensor_bytes


def other_bytes(tensor_bytes: float, outside_allocator: float) -> float:
    """Device memory beyond the tensors the model counts: the allocator's overhead over them
    plus what lies outside it (`outside_allocator_bytes`)."""
    return allocator_overhead_bytes(tensor_bytes) + outside_allocator


ALLOCATOR_ROUND_LARGE = 2 * MiB
"""A request above 10 MiB that no cached block can hold gets a segment of its size rounded up to
2 MiB (`kRoundLarge`, `get_allocation_size` in c10/cuda/CUDACachingAllocator.cpp, PyTorch 1.10-2.x)."""


def segment_bytes(size: float) -> float:
    """Bytes of the segment cudaMalloc'd for a `size`-byte request above 10 MiB (2 MiB rounding)."""
    return -(-size // ALLOCATOR_ROUND_LARGE) * ALLOCATOR_ROUND_LARGE


def new_segment_bytes(transients: list[float], largest_freed_before: float) -> float:
    """Bytes the caching allocator reserves for `transients`, requested in this order once
    everything else of the step is allocated or cached: a request that no free cached block can
    hold gets a new segment of its own (cudaMalloc succeeds while the GPU has room), which stays
    reserved after the tensor is freed (nothing calls empty_cache). Blocks never merge across
    segments and segments are sized by the request that created them (c10/cuda/
    CUDACachingAllocator.cpp: `get_free_block`, then `alloc_block`; no expandable segments before
    PyTorch 2.1), so a request larger than every block freed before it cannot reuse one. A
    smaller one is taken as served from the cache (a lower bound on the growth)."""
    grown = 0.0
    largest = largest_freed_before
    for size in transients:
        if size > largest:
            grown += segment_bytes(size)
            largest = size
    return grown


def largest_param_count(spec: ModelSpec, tp: int, embedding: bool, head: bool) -> float:
    """Elements of the largest single parameter tensor on a GPU holding transformer blocks and,
    when told, the (vocab-parallel) word embedding or output head: Megatron's fused QKV, output
    projection, FFN up (gate and up fused for SwiGLU) and down weights, each split over `tp`."""
    h = spec.hidden_size
    q_width = spec.num_attention_heads * spec.kv_channels / tp
    kv_width = max(spec.num_kv_heads / tp, 1) * spec.kv_channels
    ffn = (spec.expert_ffn_hidden_size if spec.is_moe else spec.ffn_hidden_size) / tp
    up = 2 if spec.activation == "swiglu" else 1
    largest = max(h * (q_width + 2 * kv_width), q_width * h, up * ffn * h, ffn * h)
    if embedding or head:
        largest = max(largest, spec.vocab_size * h / tp)
    return largest


def bf16_optimizer_transients(largest_param: float, stage_params: float, reduce_bytes: int) -> list[float]:
    """The two buffers DeepSpeed's BF16_Optimizer and its engine allocate beyond the tensors
    held at the activation peak, in the order a step requests them (DeepSpeed v0.6.2,
    #1801 "bf16+pipeline parallelism", 56c5223; unchanged through v0.6.x):

    1. after every micro-batch's backward, `update_hp_grads` adds each bf16 .grad into its
       fp32 accumulator through an fp32 copy, `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype)
       ...)` (runtime/bf16_optimizer.py): 4 bytes x the largest parameter, one at a time;
    2. at the end of the step, `_bf16_reduce_grads` passes the optimizer's flat fp32 gradient
       buffers (`get_grads_for_reduction` returns `fp32_groups_gradients_flat`, one per param
       group) to `buffered_allreduce_fallback`; a flat buffer alone exceeds
       MEMORY_OPT_ALLREDUCE_SIZE (5e8 elements), so `allreduce_no_retain` sends it as its own
       bucket, and `allreduce_bucket` casts it whole to the communication dtype,
       `tensor_to_allreduce = tensor.to(self.communication_data_type)` (runtime/engine.py), which
       is bf16 when bf16 is enabled and ZeRO is off and the config names none: `reduce_bytes` x
       the weight-decay group, Megatron's every weight but the biases and norms (their
       no-decay group, under 0.1 % of a stage, is neglected): taken as the stage's parameters.
       With an fp32 communication dtype (`reduce_bytes` = 4) the cast is a no-op and there is
       no copy."""
    hp_grad_copy = BYTES_FP32 * largest_param
    reduce_copy = reduce_bytes * stage_params if reduce_bytes < BYTES_FP32 else 0.0
    return [hp_grad_copy, reduce_copy]


def bf16_optimizer_freed_before(stage_params: float, dp_shards: int, largest_activation: float) -> float:
    """The largest block freed before the BF16_Optimizer's transients are first requested: the
    bf16 partition its constructor clones before casting it to fp32
    (`bf16_dp_partitions[partition_id].clone().float()`: 2 bytes x the stage's parameters over
    DP) and the largest tensor of a layer's forward or recompute (`largest_activation`)."""
    return max(BYTES_BF16 * stage_params / dp_shards, largest_activation)


def largest_activation_tensor(spec: ModelSpec, shard: Shard, flash_attention: bool) -> float:
    """Bytes of the largest single tensor a transformer block allocates in its forward: the
    unfused attention's bf16 score or probability matrix (b x a/t x s/cp x s), else its widest
    activation (the FFN up-projection's output, b x s x up*ffn/t)."""
    up = 2 if spec.activation == "swiglu" else 1
    ffn = spec.expert_ffn_hidden_size if spec.is_moe else spec.ffn_hidden_size
    widest = BYTES_BF16 * shard.local_tokens * up * ffn / shard.tp
    if flash_attention:
        return widest
    heads = spec.num_attention_heads / shard.tp
    return max(widest, BYTES_BF16 * shard.mbs * heads * (shard.seq / shard.cp) * shard.seq)


def deepspeed_pipe_buffer_bytes(
    shard: Shard, hidden: int, dtype_bytes: int, first: bool, last: bool
) -> tuple[float, float]:
    """What DeepSpeed's PipelineEngine holds beyond the layers' saved tensors on one stage:
    (bytes per in-flight micro-batch, bytes at the backward's peak). runtime/pipe/engine.py
    (v0.5.4 through v0.6.x; `is_pipe_partitioned` and, since #1407 "Big science related
    changes", `is_grad_partitioned` are both `is_model_parallel`, TP > 1):

    - every stage but the last keeps, per in-flight micro-batch, its output partitioned over TP
      in `pipe_buffers['outputs']` (`PartitionedTensor(...)`, whose `_partition_tensor` keeps a
      `.clone()` of its 1/TP slice; `first_output.data = torch.zeros(1)` drops the rest), the
      whole output without TP;
    - before its backward such a stage (TP > 1) restores that output whole
      (`outputs[0].data = part_output.full()`) and gathers the received gradient whole
      (`part_grad.full()`), both held through the backward (`grad_tensors = None` after it),
      and keeps the receive buffer `grad_layer` (one 1/TP partition, allocated once);
    - every stage but the first keeps `pipe_recv_buf`, the activation receive buffer (one 1/TP
      partition, allocated once).
    The activation (and so its gradient) is the stage boundary's hidden state, `dtype_bytes`
    per element; the partition metadata (a few int64) is neglected."""
    whole = dtype_bytes * shard.local_tokens * hidden
    part = whole / shard.tp
    restored = 2 * whole if shard.tp > 1 else 0.0
    held = 0.0 if last else part
    fixed = 0.0 if last else restored + part
    if not first:
        fixed += part
    return held, fixed
