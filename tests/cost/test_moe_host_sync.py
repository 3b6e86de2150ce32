"""Host syncs of Megatron-Core's DeepEP path (`--moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend deepep`), counted per MoE layer and pass (docs/moe.md, "Host syncs
of the DeepEP dispatcher").

Megatron-Core's own autograd functions (megatron/core/transformer/moe/fused_a2a.py, the
installed 0.19.2) run against a stand-in for DeepEP's `Buffer` that records what DeepEP's C++
does on the host (deepseek-ai/DeepEP csrc/deep_ep.cpp, `Buffer::internode_dispatch` /
`intranode_dispatch` at bfded34, 2025-10): a dispatch without a handle launches `notify_dispatch`
and busy-waits on the mapped counters ("Synchronize total received tokens and tokens per
expert"), one with a cached handle launches `cached_notify` and does not wait, a combine never
waits. The device tensors live on the meta device, so any read of device memory on the host
elsewhere in Megatron's code (`.item()`, `.tolist()`, `.cpu()` of a device tensor) would raise.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
fused_a2a = pytest.importorskip("megatron.core.transformer.moe.fused_a2a")

EXPERTS, TOP_K, TOKENS, HIDDEN = 8, 2, 16, 32


class _Group:
    """A one-rank expert-parallel group."""

    def size(self) -> int:
        return 1


class _Config:
    """DeepEP's buffer-size hints (any size will do here)."""

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, ranks: int) -> int:
        return 1

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, ranks: int) -> int:
        return 1


class _Event:
    """DeepEP's EventHandle / EventOverlap: nothing to wait for on one rank."""

    def __init__(self, *args):
        pass

    def current_stream_wait(self) -> None:
        pass


class _Buffer:
    """DeepEP's normal-mode Buffer on one rank, counting the host's waits on the GPU."""

    cpu_waits = 0

    def __init__(self, group, num_nvl_bytes, num_rdma_bytes):
        self.group, self.num_nvl_bytes, self.num_rdma_bytes = group, num_nvl_bytes, num_rdma_bytes

    @staticmethod
    def get_dispatch_config(ranks: int) -> _Config:
        return _Config()

    @staticmethod
    def get_combine_config(ranks: int) -> _Config:
        return _Config()

    def get_dispatch_layout(self, topk_idx, num_experts, **_):
        tokens = topk_idx.shape[0]
        per_rank = torch.empty(1, dtype=torch.int32, device=topk_idx.device)
        per_expert = torch.empty(num_experts, dtype=torch.int32, device=topk_idx.device)
        in_rank = torch.empty(tokens, 1, dtype=torch.bool, device=topk_idx.device)
        return per_rank, per_rank, per_expert, in_rank, _Event()

    def dispatch(self, x, handle=None, topk_idx=None, topk_weights=None, **_):
        if handle is not None:
            return x.clone(), None, None, None, handle, _Event()
        _Buffer.cpu_waits += 1
        counts = [x.shape[0] * topk_idx.shape[1] // EXPERTS] * EXPERTS
        return x.clone(), topk_idx.clone(), topk_weights.clone(), counts, ("handle",), _Event()

    def combine(self, x, handle, topk_weights=None, **_):
        return x.clone(), topk_weights, _Event()


@pytest.fixture
def deepep(monkeypatch):
    """Megatron-Core's fused_a2a wired to the stand-in Buffer, with a fresh wait count."""
    monkeypatch.setattr(fused_a2a, "Buffer", _Buffer, raising=False)
    monkeypatch.setattr(fused_a2a, "EventHandle", _Event, raising=False)
    monkeypatch.setattr(fused_a2a, "EventOverlap", _Event, raising=False)
    monkeypatch.setattr(fused_a2a, "_buffer", None)
    _Buffer.cpu_waits = 0
    return _Buffer


def _moe_layer(x: torch.Tensor) -> torch.Tensor:
    """Dispatch, the experts' grouped-GEMM input split, combine: the flex dispatcher's path
    (token_dispatch -> TEGroupedMLP.forward -> token_combine) with async_finish and
    allocate_on_comm_stream as MoEFlexTokenDispatcher passes them."""
    indices = torch.zeros(x.shape[0], TOP_K, dtype=torch.int64, device=x.device)
    probs = torch.ones(x.shape[0], TOP_K, dtype=torch.float32, device=x.device)
    recv, _, _, tokens_per_expert, handle = fused_a2a.FusedDispatch.apply(
        x, indices, probs, EXPERTS, _Group(), True, True
    )
    assert tokens_per_expert.device.type == "cpu"
    num_out_tokens = tokens_per_expert.sum().item()  # _DeepepManager's permute size
    splits = tokens_per_expert.tolist()  # TEGroupedMLP's m_splits
    assert sum(splits) == num_out_tokens
    combined, _ = fused_a2a.FusedCombine.apply(recv * 2, _Group(), handle, True, True)
    return combined


def test_one_host_wait_in_forward_none_in_backward(deepep):
    x = torch.empty(TOKENS, HIDDEN, device="meta", requires_grad=True)
    out = _moe_layer(x)
    assert deepep.cpu_waits == 1
    out.sum().backward()
    assert deepep.cpu_waits == 1
    assert x.grad is not None and x.grad.shape == x.shape


def test_full_recompute_waits_again(deepep):
    """Megatron's full recompute (tensor_parallel.checkpoint, a reentrant CheckpointFunction
    that re-runs the layer's forward in its backward), as torch's reentrant checkpoint."""
    from torch.utils.checkpoint import checkpoint

    x = torch.empty(TOKENS, HIDDEN, device="meta", requires_grad=True)
    out = checkpoint(_moe_layer, x, use_reentrant=True, preserve_rng_state=False)
    assert deepep.cpu_waits == 1
    out.sum().backward()
    assert deepep.cpu_waits == 2
