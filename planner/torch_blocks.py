"""Plain PyTorch modules for the two block styles planner models (Llama and GPT).

Used by the profiler (each layer kind at TP-sharded shapes) and embedded verbatim in the
training script that `planner export --to torch` writes, so this file must stay
self-contained: it imports torch and nothing from planner. Shapes are explicit arguments,
so a TP-sharded layer is built by passing heads / tp and ffn / tp.

Block internals follow torchtitan's names (`attention.wq/wk/wv/wo`, `feed_forward.w1/w2/w3`,
`attention_norm`, `ffn_norm`) so tensor-parallel plans keyed by them apply unchanged. The
layers live in a ModuleDict keyed by their global index: a pipeline stage deletes the layers
it does not own and sets `tok_embeddings` / `head` to None, as torchtitan does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
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
    activation: str = "swiglu"  # or "gelu"
    position_embedding: str = "rope"  # or "learned", "alibi"
    tie_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False
    embedding_norm: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0


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


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings, shape (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of x (batch, seq, heads, head_dim) by the position angle.
    The result stays in (batch, seq, heads) order, so attention's output in that order
    reshapes to (batch, seq, hidden) without a copy."""
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
        if cfg.position_embedding == "rope":
            cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        cfg = self.cfg
        q = self.wq(x).view(batch, seq, -1, cfg.head_dim)
        k = self.wk(x).view(batch, seq, -1, cfg.head_dim)
        v = self.wv(x).view(batch, seq, -1, cfg.head_dim)
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
    """SwiGLU (w2(silu(w1 x) * w3 x)) or GeLU (w2(gelu(w1 x))) MLP."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.swiglu = cfg.activation == "swiglu"
        self.w1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=cfg.linear_bias)
        self.w2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=cfg.linear_bias)
        if self.swiglu:
            self.w3 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=cfg.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(_SwiGLUFunction.apply(self.w1(x), self.w3(x)))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.attention_norm = make_norm(cfg)
        self.attention = Attention(cfg)
        self.ffn_norm = make_norm(cfg)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Embedding(nn.Module):
    """Token embedding, plus learned positions (GPT) or an embedding norm (BLOOM)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = (
            nn.Embedding(cfg.max_seq_len, cfg.hidden_size)
            if cfg.position_embedding == "learned"
            else None
        )
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
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.num_layers)})
        self.head: Head | None = Head(cfg)
        if cfg.tie_embeddings:
            self.head.output.weight = self.tok_embeddings.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        return self.head(h) if self.head is not None else h
