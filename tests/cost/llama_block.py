"""torchtitan's 2024-12 Llama 3 block at tiny sizes, as eager PyTorch and inductor run it, and
the memory-bound bytes a pass moves per element of its activation widths against what the cost
model charges the block (docs/accuracy_published.md sections 15 and 16): the helpers of
tests/cost/test_inductor_elementwise.py and tests/cost/test_eager_elementwise.py."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from planner.catalog import resolve_model
from planner.cost.shapes import Shard, layer_work

DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, BATCH, SEQ = 128, 8, 2, 16, 448, 2, 32
WIDTHS = {DIM: "h", KV_HEADS * HEAD_DIM: "kv", FFN: "ffn"}
"""Elements per token of the block's activations: hidden (= q = repeated k/v), k/v, MLP."""
RUNS = Path(__file__).resolve().parents[1] / "bench" / "published_runs.toml"


def block(
    dim: int = DIM,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    ffn: int = FFN,
    *,
    torch_rmsnorm: bool = False,
):
    """torchtitan's Llama 3 block (models/llama/model.py): RMSNorm, separate wq/wk/wv, RoPE by
    complex multiplication (`apply_rotary_emb`; skipped when the block gets no table), `repeat_kv`
    by expand and reshape, SDPA, `w2(silu(w1(x)) * w3(x))`, two residual adds. Its 2024-12
    RMSNorm upcasts to fp32 op by op; `torch_rmsnorm`: torch's nn.RMSNorm, as from 2025. Tiny sizes."""
    from torch import nn
    from torch.nn import functional as F

    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = freqs_cis[: xq_.shape[1]].view(1, xq_.shape[1], 1, xq_.shape[-1])
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    def repeat_kv(x, n_rep):
        bs, slen, n_kv_heads, head_dim = x.shape
        return x.unsqueeze(3).expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, -1, head_dim)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.eps, self.weight = 1e-6, nn.Parameter(torch.ones(dim))

        def forward(self, x):
            y = x.float()
            return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight

    def norm():
        return nn.RMSNorm(dim) if torch_rmsnorm else RMSNorm()

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(dim, heads * head_dim, bias=False)
            self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wo = nn.Linear(heads * head_dim, dim, bias=False)

        def forward(self, x, freqs_cis):
            bs, seq, _ = x.shape
            xq, xk, xv = (w(x).view(bs, seq, -1, head_dim) for w in (self.wq, self.wk, self.wv))
            if freqs_cis is not None:
                xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
            rep = xq.shape[2] // xk.shape[2]
            keys, values = repeat_kv(xk, rep), repeat_kv(xv, rep)
            out = F.scaled_dot_product_attention(
                xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True
            )
            return self.wo(out.transpose(1, 2).contiguous().view(bs, seq, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3 = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
            self.w2 = nn.Linear(ffn, dim, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.feed_forward = Attention(), FeedForward()
            self.attention_norm, self.ffn_norm = norm(), norm()

        def forward(self, x, freqs_cis):
            h = x + self.attention(self.attention_norm(x), freqs_cis)
            return h + self.feed_forward(self.ffn_norm(h))

    return Block()


SAVE_2024_12 = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
)
"""torchtitan's 2024-12 per-op SAC `_save_list` (CPU's flash attention op joins it, as CUDA's is
on it)."""


def per_op_sac(block, save_ops):
    """`block` wrapped as torchtitan's per-op SAC wraps it: the ops in `save_ops` kept, but every
    second mm (counted separately in the forward and in the recompute) recomputed, all else
    recomputed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    mm = torch.ops.aten.mm.default

    def policy():
        meta = defaultdict(int)

        def _custom_policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == mm:
                meta[key] += 1
            to_save = func in save_ops and not (func == mm and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

        return _custom_policy

    return checkpoint_wrapper(
        block, preserve_rng_state=False, context_fn=lambda: create_selective_checkpoint_contexts(policy())
    )


def checkpointed(block, ac: str):
    """torchtitan's `_apply_ac_to_transformer_block` (2024-12): "full", or "op" (per-op SAC over
    `SAVE_2024_12`)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if ac == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    return per_op_sac(block, SAVE_2024_12)


def inputs():
    """The block's bf16 input (a leaf that wants its gradient) and the RoPE table, seeded."""
    torch.manual_seed(0)
    x = torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.outer(torch.arange(SEQ).float(), torch.rand(HEAD_DIM // 2))
    return x, torch.polar(torch.ones_like(freqs), freqs)


def bytes_per_element(accesses) -> dict[str, float]:
    """Bytes that `accesses`, (elements, bytes per element, times accessed), move per token, per
    element of each activation width ("h", "kv", "ffn"), complex elements counted as two reals;
    accesses of other sizes (weights, the RoPE table, per-token statistics) are left out, each
    under 1% at Llama 3's sizes."""
    totals = dict.fromkeys(WIDTHS.values(), 0.0)
    for numel, item, times in accesses:
        reals = 2 if item == 8 else 1
        width = numel * reals / (BATCH * SEQ)
        if width in WIDTHS:
            totals[WIDTHS[width]] += item / reals * times
    return totals


def traffic_ratio(model: str, *passes: dict[str, float]) -> float:
    """The bytes of `passes` (per element of each width; together forward, backward and the
    recomputed forward) over what the model charges a block at elementwise_traffic 1 (forward,
    backward, and the forward again as recompute: per-op SAC's elementwise ops and full AC both
    re-run it), at `model`'s widths."""
    spec = resolve_model(model)
    assert spec.num_attention_heads * spec.kv_channels == spec.hidden_size  # q and repeated k/v: width h
    width = {"h": spec.hidden_size, "kv": spec.num_kv_heads * spec.kv_channels, "ffn": spec.ffn_hidden_size}
    counted = sum(width[k] * p[k] for p in passes for k in width)
    work = layer_work(spec, "transformer", Shard(mbs=1, seq=8192))
    charged = (2 * work.elementwise_bytes_fwd + work.elementwise_bytes_bwd) / 8192
    return counted / charged
