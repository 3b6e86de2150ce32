"""The loss's transient memory and FSDP's unsharded root group, against the runtimes' own code.

The eager loss is run for real (CPU, bf16 logits as torchtitan's train step makes them) under a
dispatch mode that tracks every storage the ops create and reports the peak of the live ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.memory import (
    BYTES_FP32,
    embedding_param_count,
    head_param_count,
    loss_transient_bytes,
    transformer_param_count,
)
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.layout import Layout, even_stage_layers
from planner.predict import fsdp_root_params, predict
from planner.spec import Cluster


class LivePeak(TorchDispatchMode):
    """Peak bytes of the storages created by the ops run inside it and still alive."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                held = self.live.get(storage.data_ptr())
                if held is None or held[0].expired():
                    self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def measured_eager_loss_peak_per_logit(tokens: int, vocab: int, hidden: int = 8) -> float:
    """torchtitan's loss step (logits by the head's matmul, `cross_entropy(pred.float(), labels)`,
    `del pred`, backward) run for real: peak live bytes per logit."""
    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    with LivePeak() as mode:
        pred = h @ w.t()
        loss = F.cross_entropy(pred.float(), labels)
        del pred
        loss.backward()
    return mode.peak / (tokens * vocab)


def test_eager_fp32_loss_buffers_match_torch():
    spec = resolve_model("tiny-llama")
    tokens = 256
    shard = Shard(mbs=1, seq=tokens, tp=1, cp=1, sequence_parallel=False)
    logits = tokens * spec.vocab_size
    charged = loss_transient_bytes(spec, shard, 2, "eager_fp32") / logits
    saved_softmax = BYTES_FP32  # counted with the head's saved activations, not here
    measured = measured_eager_loss_peak_per_logit(tokens, spec.vocab_size)
    # what remains is the head's weight gradient (vocab x 8 bf16 over tokens x vocab logits)
    assert measured - saved_softmax == pytest.approx(charged, abs=0.1)
    assert charged == 8.0  # two fp32 gradient buffers of the logits' shape in the backward


def test_fused_loss_keeps_only_the_dtype_logits_beside_its_softmax():
    spec = resolve_model("tiny-llama")
    shard = Shard(mbs=2, seq=128, tp=2, cp=1, sequence_parallel=False)
    assert loss_transient_bytes(spec, shard, 2, "fused") == 2 * 256 * spec.vocab_size / 2


def test_cost_option_sets_the_heads_transient_bytes():
    spec, gpu = resolve_model("llama3-8b"), resolve_gpu("h100")
    shard = Shard(mbs=2, seq=8192, tp=1, cp=1, sequence_parallel=False)
    cluster = Cluster.of(gpu, 8)
    fused = CostModel(spec, cluster, CostOptions()).layer_costs("head", shard).peak_extra_bytes
    eager = (
        CostModel(spec, cluster, CostOptions.of(cross_entropy="eager_fp32")).layer_costs("head", shard).peak_extra_bytes
    )
    logits = 2 * 8192 * 128256
    assert (fused, eager) == (2 * logits, 8 * logits)


@pytest.mark.parametrize("model", ["llama3-8b", "mpt-7b"])
def test_fsdp_root_group_is_held_unsharded(model):
    """ZeRO-3 weights: the sharded fp32 copy, two unsharded bf16 blocks (the one computing and
    the one prefetched) and the root group's unsharded bf16 embedding, final norm and head."""
    spec, gpu = resolve_model(model), resolve_gpu("h100")
    cluster = Cluster.of(gpu, 8)
    cost = CostModel(spec, cluster, CostOptions())
    layout = Layout(
        tp=1,
        pp=1,
        dp=8,
        cp=1,
        vpp=1,
        mbs=1,
        num_microbatches=1,
        schedule="1f1b",
        recompute=("full",),
        sequence_parallel=False,
        zero_stage=3,
        stage_layers=even_stage_layers(spec.num_layers, 1, 1, "1f1b"),
    )
    root = embedding_param_count(spec) + head_param_count(spec, shares_rank_with_embedding=True)
    assert fsdp_root_params(cost, layout, 0) == root
    weights = predict(cost, layout, 8, 2048).memory[0].weights
    total = root + spec.num_layers * transformer_param_count(spec)
    blocks_unsharded = 2 * 2 * transformer_param_count(spec)
    assert weights == pytest.approx(4 * total / 8 + blocks_unsharded + 2 * root, rel=1e-9)
