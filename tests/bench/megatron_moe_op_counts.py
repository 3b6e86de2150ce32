"""The ops one Megatron-core MoE layer dispatches per micro-batch, as the Megatron MoE ModelZoo's
Qwen3-235B rows run it, counted by running Megatron's own code on CPU.

    PYTHONPATH=. python tests/bench/megatron_moe_op_counts.py [--megatron DIR]

DIR is a Megatron-LM checkout at 1e057005 (the ModelZoo rows' code); without it the script
extracts megatron/core at 1e057005 from the mirror /work/.mirror/NVIDIA+Megatron-LM/repo, or
falls back to the installed megatron-core. The layer is megatron-core's MoELayer with its
TopKRouter (aux_loss, fp32 router, top-8 of 128 experts), MoEFlexTokenDispatcher (DeepEP) and
TEGroupedMLP, at TP 4, EP 8, ETP 1 with sequence parallelism under a fake process group of 32
ranks, in bf16, under a TorchDispatchMode that tells kernel-launching ops from views as
scripts/count_kernels.py does. What cannot run on CPU is replaced by a stub that runs no torch
op under the counter and instead adds what the real code launches, read at its version
(`EXTERNAL`): DeepEP's Buffer (get_dispatch_layout, internode dispatch and combine: C++ at
deepseek-ai/DeepEP aae9fa9, 2025-05-23, the last commit before 1e057005), Transformer
Engine's fused permute / unpermute (Triton, Python-launched) and GroupedLinear (one cuBLASLt
GEMM per local expert from C++) at TE v2.3 (2025-04-28, the last release before 1e057005; the
ModelZoo names no container), and Megatron's fused weighted SwiGLU (one fused kernel each
way). Megatron's own Python around them (fused_a2a.FusedDispatch / FusedCombine, the
dispatcher, the router, the experts' module) runs for real. Two local-expert counts (8 and 16)
separate the fixed part from the per-local-expert part.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from scripts.count_kernels import TRACE_MBS, TRACE_SEQ, count_module, op_kind

MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
COMMIT = "1e057005"
TP, EP, WORLD = 4, 8, 32
TOKENS, HIDDEN, FFN, TOPK = 256, 64, 32, 8

EXTERNAL: dict[str, tuple[int, int, int, str]] = {
    # name: (Python-dispatched ops, C++-issued ops, host synchronisations, source)
    "deepep.get_dispatch_layout": (
        0,
        5,
        0,
        "DeepEP aae9fa9 csrc/deep_ep.cpp:241-248: 4 torch::empty, internode::get_dispatch_layout kernel",
    ),
    "deepep.dispatch": (
        0,
        14,
        1,
        "csrc/deep_ep.cpp:747-756 (4 torch::empty, notify_dispatch kernel), "
        ":771-790 (CPU busy-waits on moe_recv_counter: host sync), :797-818 (8 torch::empty), "
        ":831 internode::dispatch kernel",
    ),
    "deepep.dispatch_cached": (
        0,
        3,
        0,
        "csrc/deep_ep.cpp:737 cached_notify kernel, :797 recv_x, "
        ":831 internode::dispatch kernel (handle given: no counts to wait for)",
    ),
    "deepep.combine": (0, 3, 0, "csrc/deep_ep.cpp:948 cached_notify kernel, :960 combined_x, :961 combine kernel"),
    "deepep.combine_weights": (0, 4, 0, "csrc/deep_ep.cpp:939 combined_topk_weights, :948, :960, :961"),
    "te.permute_fwd": (
        7,
        0,
        0,
        "TE v2.3 pytorch/triton/permutation.py:85,88 (2 torch.empty), :90,100 (2 Triton "
        "kernels), :200,202 (2 torch.empty), :214 (_permute_kernel)",
    ),
    "te.permute_bwd": (
        3,
        0,
        0,
        "TE v2.3 permutation.py:319 -> triton/permutation.py:336,339 (2 torch.empty), :344 (_unpermute_kernel)",
    ),
    "te.unpermute_fwd": (2, 0, 0, "TE v2.3 permutation.py:365 -> triton/permutation.py:336, :344"),
    "te.unpermute_bwd": (2, 0, 0, "TE v2.3 permutation.py:451 -> triton/permutation.py:200, :214"),
    "te.grouped_linear_fwd": (
        4,
        0,
        0,
        "TE v2.3 module/grouped_linear.py:93 (inp.view, torch.split: 2 views), "
        ":151 torch.empty, :229 out.view (a view)",
    ),
    "te.grouped_linear_bwd": (
        4,
        0,
        0,
        "TE v2.3 grouped_linear.py:252-253 (view, split), :295 torch.empty, :408 dgrad.view",
    ),
    "megatron.weighted_swiglu_fwd": (1, 0, 0, "Megatron 1e057005 fusions/fused_bias_swiglu.py: one fused kernel"),
    "megatron.weighted_swiglu_bwd": (1, 0, 0, "the fused backward: one kernel"),
}
"""Ops per call of what the real run replaces, read from its code. Per local expert the TE
GroupedLinear adds C++-issued work counted in `PER_EXPERT_EXTERNAL`."""

PER_EXPERT_EXTERNAL = {
    "te.grouped_linear_fwd": (
        0,
        1,
        "TE v2.3 csrc/extensions/gemm.cpp:340-397 -> common/gemm/cublaslt_gemm.cu:"
        "650-653: one nvte_cublas_gemm (cublasLtMatmulAlgoGetHeuristic :534 and "
        "cublasLtMatmul :542) per expert",
    ),
    "te.grouped_linear_bwd": (
        1,
        2,
        "grouped_linear.py:307 dgrad and :336-345 wgrad grouped GEMMs: two GEMMs per "
        "expert from C++; :376 one torch.empty per expert (handle_custom_ddp_from_mcore, "
        "Megatron's weights carry grad_added_to_main_grad)",
    ),
}
"""(Python-dispatched ops, C++-issued ops, source) per local expert and call."""

VIEW_NAMES = {"te.grouped_linear_fwd": 3, "te.grouped_linear_bwd": 3}
"""Of a stub's Python-dispatched ops, how many are views (the rest launch or allocate)."""


@dataclass
class Tally:
    """Ops seen in one pass."""

    kernels: int = 0
    views: int = 0
    cpp: int = 0
    syncs: list[str] = field(default_factory=list)


class _Counter(TorchDispatchMode):
    """Counts kernel-launching ops and views (scripts/count_kernels.py's `op_kind`)."""

    def __init__(self, tally: Tally):
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = op_kind(func, out)
        if kind == "view":
            self.tally.views += 1
        elif kind == "kernel":
            self.tally.kernels += 1
        if func in (torch.ops.aten._local_scalar_dense.default,):
            self.tally.syncs.append(f"{func} (.item()/.tolist() of a CPU tensor here)")
        return out


STATE: dict[str, Tally] = {}


def _charge(name: str, experts: int = 0) -> None:
    """Add `name`'s ops (read from the real code) to the pass being counted."""
    tally = STATE["now"]
    python, cpp, syncs, _ = EXTERNAL[name]
    views = VIEW_NAMES.get(name, 0)
    tally.kernels += python - views
    tally.views += views
    tally.cpp += cpp
    tally.syncs += [name] * syncs
    if name in PER_EXPERT_EXTERNAL:
        per_python, per_cpp, _ = PER_EXPERT_EXTERNAL[name]
        tally.kernels += per_python * experts
        tally.cpp += per_cpp * experts


def _quiet(fn):
    """Run `fn` with the counter off (a stub's own tensor plumbing is not the real code's)."""
    with torch.utils._python_dispatch._disable_current_modes():
        return fn()


class _FakeBuffer:
    """DeepEP's Buffer as Megatron's fused_a2a calls it: routes every token to the local rank
    and charges what its C++ launches."""

    def __init__(self, num_local_experts: int):
        self.local = num_local_experts

    def get_dispatch_layout(self, topk_idx, num_experts, **unused):
        _charge("deepep.get_dispatch_layout")
        return None, None, None, None, None

    def dispatch(self, x, handle=None, topk_idx=None, topk_weights=None, **unused):
        if handle is not None:
            _charge("deepep.dispatch_cached")
            return _quiet(lambda: torch.empty_like(x)), None, None, None, None, None
        _charge("deepep.dispatch")

        def received():
            idx = torch.randint(0, self.local, topk_idx.shape) if self.local else topk_idx
            counts = torch.bincount(idx.flatten(), minlength=self.local).tolist()
            return torch.empty_like(x), idx, torch.rand(topk_weights.shape), counts

        recv_x, idx, weights, counts = _quiet(received)
        return recv_x, idx, weights, counts, ("handle", x.shape[0]), None

    def combine(self, x, handle, topk_weights=None, **unused):
        _charge("deepep.combine" if topk_weights is None else "deepep.combine_weights")
        rows = handle[1]
        out = _quiet(lambda: torch.empty(rows, x.shape[1], dtype=x.dtype))
        weights = None if topk_weights is None else _quiet(lambda: torch.empty(rows, topk_weights.shape[1]))
        return out, weights, None


def _stub(name: str, forward, backward):
    """An autograd Function that charges `name`_fwd / _bwd and computes shapes only."""

    class Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            _charge(f"{name}_fwd", getattr(ctx, "experts", 0))
            return _quiet(lambda: forward(ctx, *args))

        @staticmethod
        def backward(ctx, *grads):
            _charge(f"{name}_bwd", getattr(ctx, "experts", 0))
            return _quiet(lambda: backward(ctx, *grads))

    return Stub


def _permute_fwd(ctx, tokens, probs, routing_map, num_out_tokens):
    ctx.shapes = tokens.shape, probs.shape
    return (
        torch.empty(num_out_tokens, tokens.shape[1], dtype=tokens.dtype),
        torch.empty(num_out_tokens),
        torch.empty(1, dtype=torch.int64),
    )


def _permute_bwd(ctx, grad, grad_probs, unused):
    return torch.empty(ctx.shapes[0], dtype=grad.dtype), None, torch.empty(ctx.shapes[1]), None


def _unpermute_fwd(ctx, x, row_map, restore_shape):
    ctx.shape = x.shape
    return torch.empty(restore_shape, dtype=x.dtype)


def _unpermute_bwd(ctx, grad):
    return torch.empty(ctx.shape, dtype=grad.dtype), None, None


Permute = _stub("te.permute", _permute_fwd, _permute_bwd)


def _permute(tokens, probs, routing_map, num_out_tokens):
    """TE v2.3 moe_permute_with_probs (permutation.py:572-575): output, permuted probs, row-id map."""
    output, permuted_probs, row_id_map = Permute.apply(tokens, probs, routing_map, num_out_tokens)
    return output, permuted_probs, row_id_map


Unpermute = _stub("te.unpermute", _unpermute_fwd, _unpermute_bwd)


def _swiglu_fwd(ctx, x, probs):
    ctx.shapes = x.shape, probs.shape
    return torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype)


def _swiglu_bwd(ctx, grad):
    return torch.empty(ctx.shapes[0], dtype=grad.dtype), torch.empty(ctx.shapes[1])


Swiglu = _stub("megatron.weighted_swiglu", _swiglu_fwd, _swiglu_bwd)


class _GroupedGemm(torch.autograd.Function):
    """TE's _GroupedLinear: charges its Python ops and one GEMM per expert (three backward)."""

    @staticmethod
    def forward(ctx, x, weight, experts):
        ctx.experts, ctx.shape = experts, x.shape
        _charge("te.grouped_linear_fwd", experts)
        return _quiet(lambda: torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype))

    @staticmethod
    def backward(ctx, grad):
        _charge("te.grouped_linear_bwd", ctx.experts)
        return _quiet(lambda: torch.empty(ctx.shape, dtype=grad.dtype)), None, None


class GroupedLinear(torch.nn.Module):
    """Megatron's TEGroupedLinear (TE GroupedLinear) as TEGroupedMLP builds it: (out, bias)."""

    def __init__(self, num_gemms, input_size, output_size, **unused):
        super().__init__()
        self.num_gemms = num_gemms
        self.weight = torch.nn.Parameter(torch.zeros(output_size, input_size, dtype=torch.bfloat16))

    def forward(self, x, m_splits):
        assert len(m_splits) == self.num_gemms
        return _GroupedGemm.apply(x, self.weight, self.num_gemms), None


def extract(commit: str = COMMIT) -> Path | None:
    """megatron/core at `commit` from the mirror, in a temporary directory (None: no mirror)."""
    if not MIRROR.exists():
        return None
    out = Path(tempfile.mkdtemp())
    archive = subprocess.run(
        ["git", "-C", str(MIRROR), "archive", commit, "megatron/core"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


@contextlib.contextmanager
def _megatron_at(root: Path | None):
    """megatron.core imported from `root` (the installed one when None) on a fake 32-rank process
    group with TP 4, EP 8; the process group, torch.cuda.current_device and the previously
    imported megatron modules restored afterwards."""
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "megatron"}
    current_device = torch.cuda.current_device
    if root is not None:
        sys.path.insert(0, str(root))
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        parallel_state = importlib.import_module("megatron.core.parallel_state")
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=TP,
            expert_model_parallel_size=EP,
            expert_tensor_parallel_size=1,
            create_gloo_process_groups=False,
        )
        yield
        parallel_state.destroy_model_parallel()
    finally:
        dist.destroy_process_group()
        torch.cuda.current_device = current_device
        if root is not None:
            sys.path.remove(str(root))
        for name in [name for name in sys.modules if name.split(".")[0] == "megatron"]:
            del sys.modules[name]
        sys.modules.update(saved)


def _not_on_this_path(*unused):
    raise AssertionError("the flex dispatcher with probs does not call this TE function")


def _patch():
    """Swap in the stubs where the real run calls DeepEP and TE."""
    fused_a2a = importlib.import_module("megatron.core.transformer.moe.fused_a2a")
    dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    experts = importlib.import_module("megatron.core.transformer.moe.experts")
    # fused_a2a.py:168-198, the wrappers HAVE_DEEP_EP defines
    dispatcher.fused_dispatch = lambda x, idx, probs, n, group, ev=None: fused_a2a.FusedDispatch.apply(
        x.contiguous(), idx, probs, n, group, ev
    )
    dispatcher.fused_combine = lambda x, group, handle, ev=None: fused_a2a.FusedCombine.apply(x, group, handle, ev)
    torch.cuda.current_device = lambda: "cpu"  # router.py:75 moves its weight to the current device
    utils.HAVE_TE = True
    for unused in ("fused_permute", "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs"):
        setattr(utils, unused, _not_on_this_path)
    utils.fused_permute_with_probs = lambda t, p, m, num_out_tokens: _permute(t, p, m, num_out_tokens)
    utils.fused_unpermute = lambda x, row_map, merging_probs=None, restore_shape=None: Unpermute.apply(
        x, row_map, restore_shape
    )
    experts.weighted_bias_swiglu_impl = lambda x, bias, probs, fp8_store=False: Swiglu.apply(x, probs)
    return fused_a2a


def build_layer(num_experts: int):
    """megatron-core's MoELayer as the ModelZoo's Qwen3-235B recipe configures it, scaled down."""
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import TEGroupedMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=FFN,
        moe_ffn_hidden_size=FFN,
        num_moe_experts=num_experts,
        moe_router_topk=TOPK,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3,
        moe_router_dtype="fp32",
        moe_token_dispatcher_type="flex",
        moe_enable_deepep=True,
        moe_permute_fusion=True,
        moe_grouped_gemm=True,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        bias_activation_fusion=True,
        add_bias_linear=False,
        tensor_model_parallel_size=TP,
        expert_model_parallel_size=EP,
        expert_tensor_parallel_size=1,
        sequence_parallel=True,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=True,
        qk_layernorm=True,
    )
    experts = ModuleSpec(
        module=TEGroupedMLP, submodules=MLPSubmodules(linear_fc1=GroupedLinear, linear_fc2=GroupedLinear)
    )
    layer = MoELayer(config, MoESubmodules(experts=experts, shared_experts=None))
    return layer.to(torch.bfloat16)


def count(num_experts: int, fused_a2a) -> dict[str, Tally]:
    """Forward and backward ops of one MoE layer with `num_experts` experts (num_experts / EP local)."""
    fused_a2a.get_buffer = lambda group, hidden_bytes: _FakeBuffer(num_experts // EP)
    torch.manual_seed(0)
    layer = build_layer(num_experts)
    layer.train()
    x = torch.randn(TOKENS, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    STATE["now"] = Tally()
    layer(x)[0].sum().backward()  # a first step creates what later ones reuse (the aux loss's scale)
    tallies = {"forward": Tally(), "backward": Tally()}
    STATE["now"] = tallies["forward"]
    with _Counter(tallies["forward"]):
        out, _ = layer(x)
    grad = torch.randn_like(out)
    STATE["now"] = tallies["backward"]
    with _Counter(tallies["backward"]):
        out.backward(grad)
    return tallies


def fixed_and_per_expert(root: Path | None = None) -> dict[str, dict[str, float]]:
    """Ops per MoE layer as fixed + per-local-expert parts, forward and backward, from runs
    with 8 and 16 local experts."""
    with _megatron_at(root):
        fused_a2a = _patch()
        small, large = count(8 * EP, fused_a2a), count(16 * EP, fused_a2a)
    result = {}
    for direction in ("forward", "backward"):
        a, b = small[direction], large[direction]
        for kind in ("kernels", "views", "cpp"):
            per = (getattr(b, kind) - getattr(a, kind)) / 8
            result.setdefault(direction, {})[f"{kind}_per_expert"] = per
            result[direction][f"{kind}_fixed"] = getattr(a, kind) - 8 * per
        result[direction]["syncs"] = sorted(set(a.syncs))
    return result


def dense_mlp() -> dict[str, int]:
    """Ops of the traced dense block's MLP (planner/torch_blocks.py FeedForward, rmsnorm-swiglu-rope
    style), which the MoE layer replaces, counted as scripts/count_kernels.py counts the block."""
    from planner.catalog import resolve_model
    from planner.torch_blocks import BlockConfig, FeedForward

    torch.manual_seed(0)
    cfg = BlockConfig(**resolve_model("tiny-llama").block_fields(1, TRACE_SEQ))
    mlp = FeedForward(cfg).to(torch.bfloat16)
    x = torch.randn(TRACE_MBS, TRACE_SEQ, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    return count_module(mlp, x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron", type=Path, help="a Megatron-LM checkout (default: 1e057005 from the mirror)")
    args = parser.parse_args(argv)
    root = args.megatron or extract()
    for direction, parts in fixed_and_per_expert(root).items():
        print(direction, parts)
    print("dense MLP replaced", dense_mlp())
    return 0


if __name__ == "__main__":
    sys.exit(main())
