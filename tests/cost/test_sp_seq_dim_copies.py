"""torchtitan's tensor parallelism collective by collective: the all-gathers, reduce-scatters
and sequence-dim copies its 2025-06 Llama 3 TP plan issues per block, counted on CPU under
torch's fake process group with torch's own ColwiseParallel / RowwiseParallel /
SequenceParallel / PrepareModuleInput and loss_parallel, against what the cost model charges
(`_tp_cp_comm`, `_recompute_comm`, `sp_copy_counts`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions, sp_copy_counts
from planner.cost.shapes import Shard
from planner.spec import Cluster

pytest.importorskip("torch")

from tests.cost.llama_block import SAVE_2024_12, block, per_op_sac  # noqa: E402  (needs torch)

TP, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, BATCH, SEQ = 4, 64, 8, 4, 8, 128, 256, 2, 16


def _llama(layers: int):
    """A Llama 3 of `layers` blocks shaped as torchtitan 820504e's (the benchmark's commit,
    models/llama3/model.py): tests/cost/llama_block.py's block with torch's RMSNorm, between
    tok_embeddings and norm, output. Tiny sizes; RoPE leaves the collectives alone and is left out."""
    from torch import nn

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(VOCAB, DIM)
            self.layers = nn.ModuleDict(
                {str(i): block(DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, torch_rmsnorm=True) for i in range(layers)}
            )
            self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for layer in self.layers.values():
                h = layer(h, None)
            return self.output(self.norm(h))

    return Llama()


def _apply_tp(model, mesh) -> None:
    """torchtitan 820504e's `apply_tp` (models/llama3/parallelize_llama.py), loss_parallel on."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as Sharded
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Sharded(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Sharded(1), output_layouts=Sharded(-1), use_local_output=False),
        },
    )
    for layer in model.layers.values():
        parallelize_module(
            layer,
            mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Sharded(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Sharded(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Sharded(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Sharded(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )


def _apply_ac(model, mode: str) -> None:
    """torchtitan 820504e's `_apply_ac_to_transformer_block`: "full" (torch's default early stop;
    "full_no_early_stop" without it), or "op" (per-op SAC whose `_save_list` adds
    `_c10d_functional.reduce_scatter_tensor` and max to the 2024-12 list)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    save = SAVE_2024_12 | {torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops.aten.max.default}
    for name, layer in list(model.layers.items()):
        if mode in ("full", "full_no_early_stop"):
            wrapped = checkpoint_wrapper(layer, preserve_rng_state=False, early_stop=mode == "full")
        else:
            wrapped = per_op_sac(layer, save)
        model.layers.register_module(name, wrapped)


def _events(layers: int, ac: str) -> dict[str, list[str]]:
    """Forward and backward events of one training step of the TP-planned Llama under `ac`
    ("none", "op", "full"): "ag" and "rs" for each all-gather and reduce-scatter the runtime
    issues, "cat" for each copy of a whole gathered activation (torch.cat of its chunks). A
    dispatch mode below DTensor sees what DTensor desugars into, and only ops that run (the
    selective checkpoint's cached outputs do not)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    names = {"all_gather_into_tensor": "ag", "reduce_scatter_tensor": "rs"}

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.events = "forward", {"forward": [], "backward": []}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(t is DTensor for t in types):
                return NotImplemented  # let DTensor desugar into local ops and collectives
            out = func(*args, **(kwargs or {}))
            name = func._overloadpacket.__name__
            if func.namespace == "_c10d_functional" and name in names:
                self.events[self.phase].append(names[name])
            elif func == torch.ops.aten.cat.default and out.numel() == BATCH * SEQ * DIM:
                self.events[self.phase].append("cat")
            return out

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=TP)
    try:
        model = _llama(layers)
        _apply_tp(model, init_device_mesh("cpu", (TP,)))
        if ac != "none":
            _apply_ac(model, ac)
        tokens, labels = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
        recorder = Recorder()
        with recorder, loss_parallel():
            loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten(0, 1))
            recorder.phase = "backward"
            loss.backward()
    finally:
        dist.destroy_process_group()
    return recorder.events


def _copies(events: list[str]) -> Counter:
    """Collectives and the copies beside them: "ag", "rs", "cat_after_ag" (a copy right after
    an all-gather), "cat_before_rs" (right before a reduce-scatter) and "cat_alone" (a
    reduce-scatter's copy whose collective the selective checkpoint serves from its cache)."""
    counts = Counter(e for e in events if e != "cat")
    for i, event in enumerate(events):
        if event == "cat":
            after_ag = i > 0 and events[i - 1] == "ag"
            before_rs = i + 1 < len(events) and events[i + 1] == "rs"
            counts["cat_after_ag" if after_ag else "cat_before_rs" if before_rs else "cat_alone"] += 1
    return counts


def _all_copies(counts: Counter) -> int:
    return counts["cat_after_ag"] + counts["cat_before_rs"] + counts["cat_alone"]


def _per_block(ac: str) -> dict[str, Counter]:
    """One block's counts: two blocks' step less one block's."""
    one, two = _events(1, ac), _events(2, ac)
    return {phase: _copies(two[phase]) - _copies(one[phase]) for phase in ("forward", "backward")}


@pytest.fixture(scope="module")
def runtime():
    pytest.importorskip("torch.distributed.tensor.parallel")
    return {ac: _per_block(ac) for ac in ("none", "op", "full", "full_no_early_stop")}


def test_a_block_gathers_and_scatters_twice_each_way(runtime):
    """Forward: the attention and MLP inputs all-gathered, wo's and w2's outputs reduce-scattered;
    the backward: each one's gradient the other way; what `_tp_cp_comm` charges under SP."""
    for phase in ("forward", "backward"):
        counts = runtime["none"][phase]
        assert (counts["ag"], counts["rs"]) == (2, 2)


def test_recompute_reruns_the_all_gathers_only(runtime):
    """Per-op SAC saves the reduce-scatters' outputs and re-runs both all-gathers
    (`_recompute_comm`'s two); full AC (torch's checkpoint stops once w2's input is back) re-runs
    them and the attention output's reduce-scatter, and without its early stop (torchtitan 0.3.0's
    FullAC) w2's reduce-scatter too."""
    op = runtime["op"]["backward"] - runtime["none"]["backward"]
    full = runtime["full"]["backward"] - runtime["none"]["backward"]
    whole = runtime["full_no_early_stop"]["backward"] - runtime["none"]["backward"]
    assert (op["ag"], op["rs"]) == (2, 0)
    assert (full["ag"], full["rs"]) == (2, 1)
    assert (whole["ag"], whole["rs"]) == (2, 2)


@pytest.mark.parametrize(
    "ac,recompute,early_stop",
    [("none", "none", True), ("op", "selective", True), ("full", "full", True), ("full_no_early_stop", "full", False)],
)
def test_copies_beside_the_collectives_are_what_the_model_counts(runtime, ac, recompute, early_stop):
    """Every collective over the sequence dim copies the gathered activation once (eager). The
    model counts the compiled block's (docs/accuracy_published.md section 14, inductor's code):
    the same but for the two copies before the backward's reduce-scatters, which inductor fuses
    into the kernel summing the data gradients, and, under per-op SAC, the copy eager recompute
    makes for wo's reduce-scatter whose output is cached, which the compiled backward never
    recomputes (nothing in it needs wo's output)."""
    forward, backward, base = runtime[ac]["forward"], runtime[ac]["backward"], runtime["none"]["backward"]
    assert forward["cat_after_ag"] + forward["cat_before_rs"] == forward["ag"] + forward["rs"] == _all_copies(forward)
    assert base["cat_after_ag"] + base["cat_before_rs"] == base["ag"] + base["rs"]
    assert base["cat_before_rs"] == 2  # fused into the data gradients' sum when compiled
    cached = backward["cat_alone"]
    assert cached == (1 if ac == "op" else 0)
    again = _all_copies(backward) - _all_copies(base) - cached
    assert sp_copy_counts("transformer", recompute, "every_other_matmul", early_stop) == (
        _all_copies(forward),
        base["cat_after_ag"],
        again,
    )


def test_embedding_and_head_copy_once_each_way():
    """The embedding's reduce-scatter and the head's all-gather, and their gradients."""
    pytest.importorskip("torch.distributed.tensor.parallel")
    events = _events(1, "none")
    block = {"forward": 4, "backward": 4}
    for phase, ours in zip(("forward", "backward"), (0, 1)):
        copies = _copies(events[phase])
        outside = _all_copies(copies) - block[phase]
        assert outside == (
            sp_copy_counts("embedding", "none", "", True)[ours] + sp_copy_counts("head", "none", "", True)[ours]
        )


def test_model_charges_a_read_and_a_write_of_the_gathered_activation_per_copy():
    spec = resolve_model("llama3-8b")
    cluster = Cluster.of(resolve_gpu("h100"), 8)
    sp = Shard(mbs=2, seq=8192, tp=8, sequence_parallel=True)
    base = CostOptions.of(selective_policy="every_other_matmul", tp_backward_overlap="none")
    on, off = CostModel(spec, cluster, base.with_fields(sp_seq_dim_copies=True)), CostModel(spec, cluster, base)
    one = on.analytic.elementwise_time(2 * 2 * sp.local_tokens * spec.hidden_size, 1)
    for kind, recompute in (
        ("transformer", "selective"),
        ("transformer", "full"),
        ("embedding", "none"),
        ("head", "none"),
    ):
        fwd, bwd, again = sp_copy_counts(kind, recompute, "every_other_matmul", False)
        with_copies, without = on.layer_costs(kind, sp, recompute), off.layer_costs(kind, sp, recompute)
        assert with_copies.forward_s - without.forward_s == pytest.approx(fwd * one)
        assert with_copies.backward_input_s - without.backward_input_s == pytest.approx((bwd + again) * one)
        assert with_copies.recompute_s - without.recompute_s == pytest.approx(again * one)
        assert with_copies.comm_forward_s == without.comm_forward_s
    # no sequence parallelism, no TP: nothing to copy
    for shard in (replace(sp, sequence_parallel=False), Shard(mbs=2, seq=8192)):
        assert on.layer_costs("transformer", shard, "selective") == off.layer_costs("transformer", shard, "selective")


def _compiled_block_calls() -> list[list[str]]:
    """The kernels and collectives of one TP-planned block under per-op SAC compiled as torchtitan
    compiles it (`torch.compile(block, fullgraph=True)` after the checkpoint wrapper): inductor's
    forward and backward `call` bodies (CPU kernels), in order: "mm", a collective's name, or
    the fused kernel's name, which lists the ops fused into it."""
    import re

    import torch
    import torch.distributed as dist
    from torch._inductor.utils import run_and_get_code
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=TP)
    try:
        model = _llama(1)
        _apply_tp(model, init_device_mesh("cpu", (TP,)))
        _apply_ac(model, "op")
        compiled = torch.compile(model.layers["0"], fullgraph=True)
        x = torch.randn(BATCH, SEQ // TP, DIM, requires_grad=True)
        _, codes = run_and_get_code(lambda: compiled(x, None).sum().backward())
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    call = re.compile(
        r"^\s+(?:\w+ = )?(?:torch\.ops\._c10d_functional\.(\w+)\.default|(extern_kernels\.mm)|(cpp_fused\w*))\(", re.M
    )
    bodies = [code[code.index("def call(self, args):") :] for code in codes]
    return [[ops or ("mm" if mm else kernel) for ops, mm, kernel in call.findall(body)] for body in bodies]


@pytest.mark.slow
def test_the_compiled_block_copies_what_the_model_counts():
    """inductor's code for the block: the forward copies beside its four collectives; the
    backward copies after its four all-gathers (two gradients, two recomputed) and fuses the
    copies before its two reduce-scatters into the data gradients' sums (`add` and `cat` in one
    kernel). Its recompute re-runs the two all-gathers and two matmuls, wk and w3: wo is not
    recomputed (only its cached reduce-scatter output is used), though eager SAC recomputes it
    and the model charges it (docs/accuracy_published.md section 14)."""
    pytest.importorskip("torch.distributed.tensor.parallel")
    forward, backward = _compiled_block_calls()

    def copies(calls):
        alone = sum("cat" in c and "add" not in c for c in calls if c.startswith("cpp_fused"))
        fused = sum("cat" in c and "add" in c for c in calls if c.startswith("cpp_fused"))
        return alone, fused

    fwd, bwd, again = sp_copy_counts("transformer", "selective", "every_other_matmul", True)
    assert copies(forward) == (fwd, 0)
    assert copies(backward) == (bwd + again, 2)
    assert (backward.count("all_gather_into_tensor"), backward.count("reduce_scatter_tensor")) == (4, 2)
    assert (forward.count("mm"), backward.count("mm")) == (7, 2 * 7 + 2)
