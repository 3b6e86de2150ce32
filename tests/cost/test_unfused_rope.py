"""megatron-core's RoPE without `apply_rope_fusion` (NeMo 1.x's default, Nemotron-4 340B's run;
docs/accuracy_published.md section 17): megatron-core's own `_apply_rotary_pos_emb_bshd` run on a
bf16 q under a TorchDispatchMode, its bytes per q element and its kernels counted forward and
backward, against what planner/cost/shapes.py charges (`unfused_rope_bytes`,
`UNFUSED_ROPE_KERNELS`)."""

from __future__ import annotations

import pytest

from planner.cost.shapes import FUSED_ROPE_BYTES, UNFUSED_ROPE_KERNELS, Shard, layer_work, unfused_rope_bytes
from planner.spec import ModelSpec

torch = pytest.importorskip("torch")
rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from tests.cost.test_eager_elementwise import _distinct, _moves_memory  # noqa: E402

SEQ, HEADS, HEAD_DIM = 32, 8, 48


class _OpBytes(TorchDispatchMode):
    """Per memory-moving op, the bytes of its tensors wider than the frequency table (q and its
    slices), by pass: forward until `backward` is set, then backward."""

    def __init__(self, table: int):
        super().__init__()
        self.table, self.backward = table, False
        self.passes = {"forward": [], "backward": []}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _moves_memory(func):
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            wide = [_distinct(t) * t.element_size() for t in tensors if _distinct(t) > self.table]
            if wide:
                self.passes["backward" if self.backward else "forward"].append(sum(wide))
        return out


def counted(rotary_percent: float) -> dict[str, list[int]]:
    """Bytes of each op megatron-core's unfused RoPE runs on a [seq, batch, heads, dim] bf16 q
    rotated over `rotary_percent` of its width, forward and backward."""
    rot = int(HEAD_DIM * rotary_percent)
    q = torch.randn(SEQ, 1, HEADS, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.randn(SEQ, 1, 1, rot)
    grad = torch.ones(SEQ, 1, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    mode = _OpBytes(table=SEQ * rot)
    with mode:
        out = rope_utils._apply_rotary_pos_emb_bshd(q, freqs)
        mode.backward = True
        out.backward(grad)
    return mode.passes


@pytest.mark.parametrize("rotary_percent", [0.25, 0.5, 1.0])
def test_unfused_rope_moves_what_shapes_charges(rotary_percent):
    """Per q element: 20 f + 4 bytes forward, 20 f + 12 backward (20 f + 8 at f = 1)."""
    passes = counted(rotary_percent)
    per_element = tuple(sum(passes[p]) / (SEQ * HEADS * HEAD_DIM) for p in ("forward", "backward"))
    assert per_element == unfused_rope_bytes(rotary_percent)


def test_unfused_rope_kernels():
    """Six kernels forward (mul, neg, cat, mul, add, cat), eight backward at a partial rotation."""
    passes = counted(0.5)
    assert (len(passes["forward"]), len(passes["backward"])) == UNFUSED_ROPE_KERNELS


def test_a_block_is_charged_the_unfused_rope_on_q_and_k():
    """Unfused, a block's memory-bound bytes grow by the counted minus the fused bytes on every q
    and k element, its kernels by five forward and seven backward per tensor."""
    spec = ModelSpec(
        name="tiny",
        family="llama",
        num_layers=2,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_kv_heads=2,
        ffn_hidden_size=4 * HEADS * HEAD_DIM,
        vocab_size=1024,
        max_position_embeddings=SEQ,
        rotary_percent=0.5,
    )
    shard = Shard(mbs=1, seq=SEQ, tp=2, sequence_parallel=True)
    fused = layer_work(spec, "transformer", shard)
    unfused = layer_work(spec, "transformer", shard, rope_fusion=False)
    q_k = SEQ * (HEADS + 2) * HEAD_DIM / 2
    extra = [u - f for u, f in zip(unfused_rope_bytes(0.5), FUSED_ROPE_BYTES)]
    assert unfused.elementwise_bytes_fwd - fused.elementwise_bytes_fwd == pytest.approx(q_k * extra[0])
    assert unfused.elementwise_bytes_bwd - fused.elementwise_bytes_bwd == pytest.approx(q_k * extra[1])
    assert (unfused.kernels_fwd - fused.kernels_fwd, unfused.kernels_bwd - fused.kernels_bwd) == (10, 14)
