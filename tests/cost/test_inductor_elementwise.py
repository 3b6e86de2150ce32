"""What torch.compile fuses in a Llama block (docs/accuracy_published.md section 15): the bytes
every non-matmul, non-attention kernel of inductor's forward and backward code reads and writes
for torchtitan's 2024-12 Llama 3 block (per-op SAC or full AC, compiled on CPU), per token and
per element of the three activation widths, against the memory-bound bytes the cost model
charges a block (`layer_work`'s elementwise bytes: forward, backward and the recomputed
forward). Their ratio is the `elementwise_traffic` the compiled torchtitan rows carry."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.cost.shapes import Shard, layer_work
from planner.fidelity.published import load_runs

torch = pytest.importorskip("torch")

DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, BATCH, SEQ = 128, 8, 2, 16, 448, 2, 32
WIDTHS = {DIM: "h", KV_HEADS * HEAD_DIM: "kv", FFN: "ffn"}
"""Elements per token of the block's activations: hidden (= q = repeated k/v), k/v, MLP."""
ITEM_BYTES = {"BFloat16": 2, "bfloat16": 2, "float": 4, "float32": 4, "complex64": 8, "int64_t": 8, "bool": 1}
VIEWS = {"view_as_complex", "view_as_real", "reshape", "_conj"}
RUNS = Path(__file__).resolve().parents[1] / "bench" / "published_runs.toml"
COMPILED_ROWS = {  # torchtitan rows run with torch.compile, and their activation checkpointing
    "torchtitan-llama3-8b-fsdp8-compile": "op",
    "torchtitan-llama3-8b-fsdp128-compile": "op",
    "torchtitan-llama3-8b-fsdp8-tp8": "op",
    "torchtitan-llama3-70b-fsdp32-tp8": "full",
}


def _block():
    """torchtitan's Llama 3 block as of 2024-12 (models/llama/model.py): RMSNorm with an fp32
    upcast, separate wq/wk/wv, RoPE by complex multiplication (`apply_rotary_emb`), `repeat_kv`
    by expand and reshape, SDPA, `w2(silu(w1(x)) * w3(x))`, two residual adds. Tiny sizes."""
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
            self.eps, self.weight = 1e-6, nn.Parameter(torch.ones(DIM))

        def forward(self, x):
            y = x.float()
            return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
            self.wk = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
            self.wv = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
            self.wo = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)

        def forward(self, x, freqs_cis):
            bs, seq, _ = x.shape
            xq, xk, xv = (w(x).view(bs, seq, -1, HEAD_DIM) for w in (self.wq, self.wk, self.wv))
            xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
            keys, values = repeat_kv(xk, HEADS // KV_HEADS), repeat_kv(xv, HEADS // KV_HEADS)
            out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                 is_causal=True)
            return self.wo(out.transpose(1, 2).contiguous().view(bs, seq, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3 = nn.Linear(DIM, FFN, bias=False), nn.Linear(DIM, FFN, bias=False)
            self.w2 = nn.Linear(FFN, DIM, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.feed_forward = Attention(), FeedForward()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()

        def forward(self, x, freqs_cis):
            h = x + self.attention(self.attention_norm(x), freqs_cis)
            return h + self.feed_forward(self.ffn_norm(h))

    return Block()


def _checkpointed(block, ac: str):
    """torchtitan's `_apply_ac_to_transformer_block` (2024-12): "full", or "op" (per-op SAC:
    `_save_list` of mm and the attention ops, every second mm recomputed; CPU's flash attention
    op joins the list, as CUDA's is on it)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    if ac == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy():
        meta = defaultdict(int)

        def _custom_policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == torch.ops.aten.mm.default:
                meta[key] += 1
            to_save = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE
        return _custom_policy

    return checkpoint_wrapper(block, preserve_rng_state=False,
                              context_fn=lambda: create_selective_checkpoint_contexts(policy()))


def _compiled_code(ac: str) -> list[str]:
    """inductor's forward and backward code for one bf16 block under `ac`, compiled as torchtitan
    compiles it (`torch.compile(block, fullgraph=True)` after the checkpoint wrapper)."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    block = torch.compile(_checkpointed(_block().to(torch.bfloat16), ac), fullgraph=True)
    x = torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.outer(torch.arange(SEQ).float(), torch.rand(HEAD_DIM // 2))
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    try:
        _, codes = run_and_get_code(lambda: block(x, freqs_cis).sum().backward())
    finally:
        torch._dynamo.reset()
    return codes


def _split(args: str) -> list[str]:
    """A call's arguments, split at the top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += (ch in "([") - (ch in ")]")
        cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def _numel(sizes: str) -> int:
    """Elements of a size tuple's text; 0 for a symbolic one (the checkpoint's RNG state)."""
    parts = [p.strip() for p in sizes.split(",") if p.strip()]
    return math.prod(int(p) for p in parts) if all(p.isdigit() for p in parts) else 0


def _kernel_params(code: str) -> dict[str, list[tuple[str, str]]]:
    """Each C++ kernel's parameters: (element type, name), the name saying in_ptr (read),
    out_ptr (written) or in_out_ptr (both)."""
    params = {}
    for name, text in re.findall(r'^(cpp_fused\w+) = async_compile\.cpp_pybinding\(.*?extern "C"\s+void\s+kernel\(([^)]*)\)',
                                 code, re.M | re.S):
        params[name] = [re.match(r"\s*(?:const )?(?:at::)?(\w+)\*\s*(\w+)", p).groups() for p in text.split(",") if p.strip()]
    return params


def _accesses(code: str) -> list[tuple[int, int, int]]:
    """Every buffer access of the non-matmul, non-attention kernels in `call`: the inductor
    kernels (by their parameters) and the aten fallbacks (inputs read, output written; views
    move nothing), as (elements, bytes per element, times accessed)."""
    params = _kernel_params(code)
    alias, size, dtype, out = {}, {}, {}, []

    def root(name):
        return root(alias[name]) if name in alias else name

    for line in code[code.index("def call(self, args):"):].splitlines():
        line = line.split("; del ")[0].split("  #")[0].strip()
        if m := re.match(r"(\w+) = empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)", line):
            size[m[1]], dtype[m[1]] = _numel(m[2]), m[3]
        elif m := re.match(r"assert_size_stride\((\w+), \(([^)]*)\)", line):
            size[root(m[1])] = _numel(m[2])
        elif m := re.match(r"(\w+) = (\w+)$", line):
            alias[m[1]] = m[2]
        elif m := re.match(r"(\w+) = reinterpret_tensor\((\w+), \(([^)]*)\)", line):
            size[m[1]], dtype[m[1]] = _numel(m[3]), dtype.get(root(m[2]))
        elif m := re.match(r"(cpp_fused\w+)\((.*)\)$", line):
            for (ctype, pname), arg in zip(params[m[1]], _split(m[2])):
                view = re.match(r"reinterpret_tensor\((\w+), \(([^)]*)\)", arg)
                name = root(view[1] if view else arg)
                dtype.setdefault(name, ctype)
                out.append((name, _numel(view[2]) if view else None, ITEM_BYTES[ctype],
                            2 if pname.startswith("in_out") else 1))
        elif m := re.match(r"(\w+) = torch\.ops\.aten\.(\w+)\.\w+\((.*)\)$", line):
            op, args = m[2], [root(a) for a in _split(m[3]) if re.match(r"\w+$", a)]
            complex_view = {"view_as_complex": "complex64", "view_as_real": "float32"}
            dtype[m[1]] = complex_view.get(op, dtype.get(args[0], "complex64"))
            if op not in VIEWS and not op.startswith("_scaled_dot_product"):
                out += [(name, None, None, 1) for name in args + [m[1]]]
    return [(n if n is not None else size.get(name, 0), b or ITEM_BYTES[dtype.get(name) or "float32"], times)
            for name, n, b, times in out]


def bytes_per_element(code: str) -> dict[str, float]:
    """Bytes the graph's memory-bound kernels move per token, per element of each activation
    width ("h", "kv", "ffn"), complex elements counted as two reals; accesses of other sizes
    (weights, the RoPE table, per-token statistics) are left out, each under 1% at Llama 3's
    sizes."""
    totals = dict.fromkeys(WIDTHS.values(), 0.0)
    for numel, item, times in _accesses(code):
        reals = 2 if item == 8 else 1
        width = numel * reals / (BATCH * SEQ)
        if width in WIDTHS:
            totals[WIDTHS[width]] += item / reals * times
    return totals


def compiled_traffic(model: str, forward: dict[str, float], backward: dict[str, float]) -> float:
    """The compiled block's memory-bound bytes over what the model charges it at
    elementwise_traffic 1 (forward, backward, and the forward again as recompute: per-op SAC's
    elementwise ops and full AC both re-run it), at `model`'s widths."""
    spec = resolve_model(model)
    assert spec.num_attention_heads * spec.kv_channels == spec.hidden_size  # q and repeated k/v: width h
    width = {"h": spec.hidden_size, "kv": spec.num_kv_heads * spec.kv_channels, "ffn": spec.ffn_hidden_size}
    compiled = sum(width[k] * (forward[k] + backward[k]) for k in width)
    work = layer_work(spec, "transformer", Shard(mbs=1, seq=8192))
    charged = (2 * work.elementwise_bytes_fwd + work.elementwise_bytes_bwd) / 8192
    return compiled / charged


@pytest.fixture(scope="module", params=["op", "full"])
def counted(request):
    forward, backward = _compiled_code(request.param)
    return request.param, bytes_per_element(forward), bytes_per_element(backward)


@pytest.mark.slow
def test_the_compiled_forward_moves_what_section_15_counts(counted):
    """Forward, bytes per element: norms 4 + 6 (the second reads x and wo's output: the first
    residual is not stored, the last kernel adds it again), RoPE 20 per q/k element (bf16 -> fp32
    kernel, aten's complex mul in fp32, fp32 -> bf16 kernel: inductor does not generate code for
    complex tensors), repeat_kv's copies of k and v at width h, SwiGLU 6, last residual 8."""
    _, forward, _ = counted
    assert forward == {"h": 42, "kv": 20, "ffn": 6}


@pytest.mark.slow
def test_compiled_rows_carry_the_counted_traffic(counted):
    """Each compiled torchtitan row's elementwise_traffic is the ratio counted on inductor's code
    for its model and activation checkpointing, to two decimals."""
    ac, forward, backward = counted
    runs = {run.name: run for run in load_runs(RUNS)}
    rows = [name for name, mode in COMPILED_ROWS.items() if mode == ac]
    assert rows
    for name in rows:
        run = runs[name]
        assert run.elementwise_traffic == round(compiled_traffic(run.model, forward, backward), 2), name
