"""Plain PyTorch modules for the two block styles planner models (Llama and GPT).

Used by the profiler (each layer kind at TP-sharded shapes) and embedded verbatim in the
training script that `planner export --to torch` writes, so this file must stay
self-contained: it imports torch and nothing from planner. Shapes are explicit arguments,
so a TP-sharded layer is built by passing heads / tp and ffn / tp.

Block internals follow torchtitan's names (`attention.wq/wk/wv/wo`, `feed_forward.w1/w2/w3`,
`attention_norm`, `ffn_norm`; `moe.router`, `moe.experts`, `moe.shared_experts` in a
mixture-of-experts layer) so tensor-parallel plans keyed by them apply unchanged. The
layers live in a ModuleDict keyed by their global index: a pipeline stage deletes the layers
it does not own and sets `tok_embeddings` / `head` to None, as torchtitan does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BlockConfig:
    """The shapes of one model (or of one TP shard when heads and ffn are divided)."""

    family: str  # "llama" or "gpt"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    norm: str = "rmsnorm"  # or "layernorm"
    activation: str = "swiglu"  # or "gelu", "squared_relu"
    position_embedding: str = "rope"  # or "learned", "alibi"
    tie_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False
    embedding_norm: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # planner.spec.RopeScaling's fields: "llama3" or "yarn"
    rotary_percent: float = 1.0  # share of each head's channels RoPE rotates (the first ones)
    qk_norm: bool = False  # RMSNorm over each head's query and key before RoPE (Qwen3)
    num_experts: int = 0  # routed experts of a mixture-of-experts layer; 0: every layer dense
    moe_top_k: int = 0
    expert_ffn_hidden_size: int = 0
    shared_ffn_hidden_size: int = 0  # all shared experts together, as one SwiGLU MLP; 0: none
    first_dense_layers: int = 0
    moe_layer_freq: int = 1
    moe_score_function: str = "softmax"  # or "sigmoid"
    moe_norm_topk_prob: bool = True  # the top-k weights renormalised to sum to 1
    moe_routed_scaling_factor: float = 1.0
    moe_shared_expert_gate: bool = False  # shared experts' output times sigmoid(x . w) (Qwen2-MoE)

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` has routed experts: after the first dense ones, every
        moe_layer_freq-th layer (counting from 1)."""
        return self.num_experts > 0 and index >= self.first_dense_layers and (index + 1) % self.moe_layer_freq == 0


def _wide(t: torch.Tensor) -> torch.Tensor:
    """t in at least fp32 (the precision elementwise math runs in)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm in fp32 that keeps only its input and the reciprocal RMS for backward, as the
    fused CUDA kernel does (torch decomposes rms_norm off CUDA and keeps fp32 copies)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = _wide(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (xf * rstd * _wide(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        normed = _wide(x) * rstd
        grad_normed = _wide(grad) * _wide(weight)
        dx = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        dw = (_wide(grad) * normed).flatten(0, -2).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class RMSNorm(nn.RMSNorm):
    """torch's RMSNorm (fused on CUDA); elsewhere an equivalent that saves the same tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cuda":
            return super().forward(x)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps  # torch's default
        return _RMSNormFunction.apply(x, self.weight, eps)


def make_norm(cfg: BlockConfig) -> nn.Module:
    """RMSNorm or LayerNorm over the hidden size."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


def rope_tables(
    rotary_dim: int, seq_len: int, theta: float, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings over `rotary_dim` channels, shape (seq_len,
    rotary_dim // 2), with Llama 3.1's or YaRN's frequency scaling (`scaling`) if given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    magnitude = 1.0
    if scaling is not None and scaling["rope_type"] == "llama3":
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    elif scaling is not None and scaling["rope_type"] == "yarn":
        inv_freq = _yarn_frequencies(inv_freq, rotary_dim, theta, scaling)
        magnitude = _yarn_mscale(scaling["factor"], scaling["mscale"]) / _yarn_mscale(
            scaling["factor"], scaling["mscale_all_dim"]
        )
    elif scaling is not None:
        raise ValueError(f"unknown RoPE scaling {scaling['rope_type']!r}")
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos() * magnitude, angles.sin() * magnitude


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's scaled RoPE frequencies: long wavelengths divided by the factor, short ones
    kept, the band between blended (Meta's `apply_scaling`)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return torch.where(medium, blended, scaled)


def _yarn_frequencies(inv_freq: torch.Tensor, rotary_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN's frequencies: interpolated (divided by the factor) below beta_slow rotations over
    the original context, kept above beta_fast, ramped linearly between (channel indices
    floored and ceiled, as DeepSeek and Hugging Face do)."""

    def channel(rotations: float) -> float:
        return (
            rotary_dim
            * math.log(scaling["original_max_position_embeddings"] / (rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low = max(math.floor(channel(scaling["beta_fast"])), 0)
    high = min(math.ceil(channel(scaling["beta_slow"])), rotary_dim - 1)
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return inv_freq / scaling["factor"] * ramp + inv_freq * (1 - ramp)


def _yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention magnitude 0.1 mscale ln(factor) + 1 (1 without extension)."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of the first 2 x cos.shape[-1] channels of x (batch, seq, heads, head_dim)
    by the position angle, the rest passing through. The result stays in (batch, seq, heads)
    order, so attention's output in that order reshapes to (batch, seq, hidden) without a copy."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim < x.shape[-1]:  # partial rotary (Nemotron-4)
        return torch.cat((apply_rope(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
    seq = x.shape[1]
    cos, sin = cos[:seq, None].to(x.dtype), sin[:seq, None].to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2)


def alibi_bias(num_heads: int, seq_len: int, head_offset: int = 0, total_heads: int | None = None):
    """Causal ALiBi attention bias (heads, seq, seq) for heads head_offset.. of total_heads."""
    total = total_heads or num_heads
    closest = 2 ** math.floor(math.log2(total))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < total:
        extra = 2.0 ** (-4.0 / closest)
        slopes += [extra ** (2 * i + 1) for i in range(total - closest)]
    slope = torch.tensor(slopes[head_offset : head_offset + num_heads]).view(-1, 1, 1)
    pos = torch.arange(seq_len)
    distance = (pos.view(1, -1) - pos.view(-1, 1)).clamp(max=0).float()
    causal = torch.full((seq_len, seq_len), float("-inf")).triu(1)
    return slope * distance + causal


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads, through scaled_dot_product_attention."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.hidden_size, q_out, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.qkv_bias)
        self.wo = nn.Linear(q_out, cfg.hidden_size, bias=cfg.linear_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        if cfg.position_embedding == "rope":
            rotary_dim = int(cfg.head_dim * cfg.rotary_percent)
            cos, sin = rope_tables(rotary_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_scaling)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        cfg = self.cfg
        q = self.wq(x).view(batch, seq, -1, cfg.head_dim)
        k = self.wk(x).view(batch, seq, -1, cfg.head_dim)
        v = self.wv(x).view(batch, seq, -1, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.position_embedding == "rope":
            q = apply_rope(q, self.rope_cos, self.rope_sin)
            k = apply_rope(k, self.rope_cos, self.rope_sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        gqa = q.shape[1] != k.shape[1]  # grouped KV heads, shared in the kernel (no copies)
        if cfg.position_embedding == "alibi":
            bias = alibi_bias(q.shape[1], seq).to(device=x.device, dtype=q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class _SwiGLUFunction(torch.autograd.Function):
    """silu(gate) * up, keeping only gate and up for backward and recomputing silu there,
    as fused SwiGLU kernels do (Megatron-LM's bias_swiglu)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        g, grad_f = _wide(gate), _wide(grad)
        sig = torch.sigmoid(g)
        d_gate = grad_f * _wide(up) * sig * (1 + g * (1 - sig))
        return d_gate.to(gate.dtype), (grad_f * g * sig).to(up.dtype)


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x)), GeLU (w2(gelu(w1 x))) or squared-ReLU
    (w2(relu(w1 x)^2)) MLP."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.activation = cfg.activation
        self.swiglu = cfg.activation == "swiglu"
        self.w1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=cfg.linear_bias)
        self.w2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=cfg.linear_bias)
        if self.swiglu:
            self.w3 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=cfg.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(_SwiGLUFunction.apply(self.w1(x), self.w3(x)))
        if self.activation == "squared_relu":
            return self.w2(F.relu(self.w1(x)).square())
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` with uneven splits along dim 0; its backward sends the gradients
    back along the reversed splits (gloo and NCCL both run it)."""

    @staticmethod
    def forward(ctx, x, send_sizes, recv_sizes, group):
        ctx.sizes, ctx.group = (send_sizes, recv_sizes), group
        out = x.new_empty((sum(recv_sizes), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_sizes, send_sizes, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_sizes, recv_sizes = ctx.sizes
        out = grad.new_empty((sum(send_sizes), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), send_sizes, recv_sizes, group=ctx.group)
        return out, None, None, None


class GroupedExperts(nn.Module):
    """The routed experts' SwiGLU MLPs, weights stacked per expert (torchtitan's layout:
    w1, w3 (experts, ffn, hidden), w2 (experts, hidden, ffn)). After `shard`, this rank
    holds a contiguous slice of the experts and exchanges tokens with the other ranks of
    its expert-parallel group by all-to-all (dispatch before the MLPs, combine after)."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn_hidden_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_hidden_size))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn_hidden_size, hidden_size))
        for weight in (self.w1, self.w2, self.w3):
            bound = 1 / math.sqrt(weight.shape[-1])  # nn.Linear's default, per expert
            nn.init.uniform_(weight, -bound, bound)
        self.ep_size, self.ep_group = 1, None

    def shard(self, ep_rank: int, ep_size: int, group) -> None:
        """Keep experts ep_rank * E / ep_size .. (ep_rank + 1) * E / ep_size - 1 and send
        every token to the rank holding its expert over `group` (the expert-parallel group)."""
        local = self.num_experts // ep_size
        first = ep_rank * local
        for name in ("w1", "w2", "w3"):
            setattr(self, name, nn.Parameter(getattr(self, name).data[first : first + local].clone()))
        self.ep_size, self.ep_group = ep_size, group

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """MLP outputs of `routed` (rows sorted by expert, `counts` rows per expert, all experts)."""
        if self.ep_group is None:
            return self._mlps(routed, counts)
        ep, local = self.ep_size, self.num_experts // self.ep_size
        # dispatch: how many rows of each of my experts every rank sends me, then the rows
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.ep_group)
        received_counts = received_counts.view(ep, local)  # (source rank, my expert)
        send_sizes = counts.view(ep, local).sum(1).tolist()
        recv_sizes = received_counts.sum(1).tolist()
        received = _AllToAll.apply(routed, send_sizes, recv_sizes, self.ep_group)
        # rows arrive by source rank, then expert: regroup them by expert
        expert_of_row = torch.arange(local).repeat(ep).repeat_interleave(received_counts.flatten().cpu())
        by_expert = expert_of_row.argsort(stable=True).to(routed.device)
        out = self._mlps(received[by_expert], received_counts.sum(0))
        # combine: back to source-rank order, then to the ranks the rows came from
        return _AllToAll.apply(out[by_expert.argsort()], recv_sizes, send_sizes, self.ep_group)

    def _mlps(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outs = []
        for expert, part in enumerate(rows.split(counts.tolist())):
            gate, up = F.linear(part, self.w1[expert]), F.linear(part, self.w3[expert])
            outs.append(F.linear(_SwiGLUFunction.apply(gate, up), self.w2[expert]))
        return torch.cat(outs)


class MoE(nn.Module):
    """Mixture-of-experts MLP: the router scores the experts (softmax or sigmoid) and picks
    top-k per token (weights renormalised over the k where the model does, as Mixtral and
    Qwen3-MoE do, times its routed scaling factor), the routed experts' outputs are summed with
    those weights, and the shared experts (if any, gated for Qwen2-MoE) see every token.
    Dropless: every routed token is computed."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = GroupedExperts(cfg.num_experts, cfg.hidden_size, cfg.expert_ffn_hidden_size)
        self.shared_experts = (
            FeedForward(
                replace(cfg, ffn_hidden_size=cfg.shared_ffn_hidden_size, activation="swiglu", linear_bias=False)
            )
            if cfg.shared_ffn_hidden_size
            else None
        )
        if cfg.moe_shared_expert_gate:
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) of each token's top-k choice, fp32 weights."""
        cfg = self.cfg
        logits = self.router(tokens).float()
        scores = logits.softmax(dim=-1) if cfg.moe_score_function == "softmax" else logits.sigmoid()
        weights, experts = scores.topk(cfg.moe_top_k, dim=-1)
        if cfg.moe_norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights * cfg.moe_routed_scaling_factor, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, experts = self.route(tokens)
        top_k = self.cfg.moe_top_k
        order = experts.flatten().argsort(stable=True)  # (token, choice) pairs sorted by expert
        source = order // top_k
        counts = torch.bincount(experts.flatten(), minlength=self.experts.num_experts)
        out = self.experts(tokens[source], counts)
        out = out * weights.flatten()[order, None].to(out.dtype)
        combined = torch.zeros_like(tokens).index_add(0, source, out)
        if self.shared_experts is not None:
            shared = self.shared_experts(tokens)
            if self.cfg.moe_shared_expert_gate:
                shared = torch.sigmoid(self.shared_expert_gate(tokens)) * shared
            combined = combined + shared
        return combined.view(x.shape)


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.)); the MLP is a
    mixture of experts (`moe`) when `moe` is set, else dense (`feed_forward`)."""

    def __init__(self, cfg: BlockConfig, moe: bool = False):
        super().__init__()
        self.attention_norm = make_norm(cfg)
        self.attention = Attention(cfg)
        self.ffn_norm = make_norm(cfg)
        self.is_moe = moe
        if moe:
            self.moe = MoE(cfg)
        else:
            self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        mlp = self.moe if self.is_moe else self.feed_forward
        return x + mlp(self.ffn_norm(x))


class Embedding(nn.Module):
    """Token embedding, plus learned positions (GPT) or an embedding norm (BLOOM)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.hidden_size) if cfg.position_embedding == "learned" else None
        self.norm = make_norm(cfg) if cfg.embedding_norm else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        if self.pos is not None:
            # one position id per token, as Megatron-LM's data loader builds them
            positions = torch.arange(tokens.shape[1], device=tokens.device).repeat(tokens.shape[0], 1)
            h = h + self.pos(positions)
        return self.norm(h) if self.norm is not None else h


class Head(nn.Module):
    """Final norm and the vocabulary projection (logits)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.norm = make_norm(cfg)
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(h))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))


class Transformer(nn.Module):
    """Embedding, a ModuleDict of blocks keyed by global layer index, head. Any part may be
    None or missing on a pipeline stage; forward runs what the stage owns."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: Embedding | None = Embedding(cfg)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, cfg.is_moe_layer(i)) for i in range(cfg.num_layers)})
        self.head: Head | None = Head(cfg)
        if cfg.tie_embeddings:
            self.head.output.weight = self.tok_embeddings.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        return self.head(h) if self.head is not None else h
