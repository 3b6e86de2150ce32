"""The exported torch.distributed.pipelining script trains: two processes on CPU (gloo),
launched by torchrun, give per step the loss of the unsplit model trained in one process
on the same data from the same initial weights (fp32, SGD, within 1e-5). The mixture of
experts (tiny-moe) trains expert parallel (experts split over the two ranks, tokens sent
by all-to-all over gloo), through a pipeline, and (four processes) both at once.

All two-process scripts run in one torchrun launch (tests/export/run_scripts.py) so torch
is imported once; the unsplit references run in this process, once per distinct batch.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from export_helpers import make_plan, write_files

from planner.errors import ExportError
from planner.export.torch_pp import export_torch

pytest.importorskip("torch")

TRAIN_ARGS = ["--dtype", "fp32", "--optimizer", "sgd", "--lr", "0.01", "--steps", "3"]
LOOP_V2 = [[[0, 1], [2, 3]], [[1, 2], [3, 4]]]  # looped placement: rank r holds stages r, r + 2
V_SHAPE = [[[0, 1], [3, 4]], [[1, 2], [2, 3]]]  # V placement: rank r holds stages r, 3 - r
# On random tokens tiny-moe's loss barely moves at lr 0.01: a larger step makes the later
# steps' losses depend on the update (and so on the experts' gradients) far above 1e-5.
MOE_ARGS = ["--lr", "1.0"]

# name -> (model, plan fields, extra script arguments); every plan runs on 2 processes.
RUNS = {
    "gpipe": ("tiny-llama", dict(schedule="gpipe"), []),
    "1f1b": ("tiny-llama", dict(schedule="1f1b", stage_layers=[[0, 1], [1, 4]]), []),
    "interleaved_1f1b": ("tiny-llama", dict(schedule="interleaved_1f1b", vpp=2, stage_layers=LOOP_V2), []),
    "interleaved_1f1b_from_csv": (
        "tiny-llama",
        dict(schedule="interleaved_1f1b", vpp=2, stage_layers=LOOP_V2),
        ["--schedule-csv", "schedule.csv"],
    ),
    "looped_bfs": ("tiny-llama", dict(schedule="looped_bfs", vpp=2, stage_layers=LOOP_V2), []),
    "zb_h1_interleaved": ("tiny-llama", dict(schedule="zb_h1", vpp=2, stage_layers=LOOP_V2), []),
    "zb_h2_from_csv": ("tiny-llama", dict(schedule="zb_h2"), []),
    "zbv": ("tiny-llama", dict(schedule="zbv", vpp=2, stage_layers=V_SHAPE), []),
    "dualpipev": ("tiny-llama", dict(schedule="dualpipev", vpp=2, stage_layers=V_SHAPE), []),
    "gpt_tied_across_ranks": ("tiny-gpt", dict(schedule="1f1b", stage_layers=[[0, 3], [3, 4]]), []),
    "gpt_tied_on_one_rank_zbv": ("tiny-gpt", dict(schedule="zbv", vpp=2, stage_layers=V_SHAPE), []),
    "tensor_parallel_full_recompute": (
        "tiny-llama",
        dict(tp=2, pp=1, num_microbatches=2, stage_layers=[[0, 4]], recompute="full"),
        [],
    ),
    "gpt_fsdp_zero3": ("tiny-gpt", dict(dp=2, pp=1, num_microbatches=2, zero_stage=3, stage_layers=[[0, 4]]), []),
    "moe_expert_parallel": ("tiny-moe", dict(dp=2, ep=2, pp=1, num_microbatches=2, stage_layers=[[0, 6]]), MOE_ARGS),
    "moe_pipeline_1f1b": ("tiny-moe", dict(schedule="1f1b", stage_layers=[[0, 2], [2, 6]]), MOE_ARGS),
    # four processes (a second launch): expert parallel across the data-parallel replicas of
    # each DualPipeV stage, all-to-alls inside the pipelined forward and backward
    "moe_expert_parallel_dualpipev_4_processes": (
        "tiny-moe",
        dict(dp=2, ep=2, schedule="dualpipev", vpp=2, stage_layers=[[[0, 1], [5, 6]], [[1, 3], [3, 5]]]),
        MOE_ARGS,
    ),
}
LOSS_LINE = re.compile(r"^step (\d+) loss (\S+) time_s (\S+)$")


def losses_of(text: str) -> list[float]:
    return [float(m.group(2)) for m in map(LOSS_LINE.match, text.splitlines()) if m]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torch_exports")
    folders = {}
    for name, (model, fields, _) in RUNS.items():
        plan_file = make_plan(model, dtype="fp32", **fields)
        assert plan_file.plans[0].num_gpus == (4 if name.endswith("_4_processes") else 2)
        folders[name] = write_files(export_torch(plan_file), root / name)
    return folders


@pytest.fixture(scope="module")
def distributed_losses(exported) -> dict[str, list[float]]:
    """Every two-process script in one torchrun launch, the four-process ones in another."""
    four = [name for name in RUNS if name.endswith("_4_processes")]
    return launch(exported, [name for name in RUNS if name not in four], 2) | launch(exported, four, 4)


def launch(exported, names: list[str], processes: int) -> dict[str, list[float]]:
    """The step losses of the scripts `names`, run one after the other in one torchrun launch."""
    items = [
        "|".join(
            [
                str(exported[name] / "train_pipeline.py"),
                *[str(exported[name] / a) if a.endswith(".csv") else a for a in RUNS[name][2]],
            ]
        )
        for name in names
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
        str(Path(__file__).with_name("run_scripts.py")),
        *TRAIN_ARGS,
        "--",
        *items,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    sections = re.split(r"^=== (.*)$", done.stdout, flags=re.M)[1:]
    by_script = {item.split("|")[0]: losses_of(text) for item, text in zip(sections[::2], sections[1::2])}
    return {name: by_script[str(exported[name] / "train_pipeline.py")] for name in names}


def reference_args(extra: list[str]) -> list[str]:
    """A run's extra script arguments that also apply to the unsplit model (all but the CSV)."""
    if "--schedule-csv" not in extra:
        return extra
    at = extra.index("--schedule-csv")
    return extra[:at] + extra[at + 2 :]


def reference_losses(script: Path, extra: list[str] = ()) -> list[float]:
    """The script's unsplit single-process run (`--reference`), in this process."""
    out = io.StringIO()
    argv = sys.argv
    try:
        sys.argv = [str(script), "--reference", *TRAIN_ARGS, *extra]
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    return losses_of(out.getvalue())


@pytest.fixture(scope="module")
def references(exported) -> dict[str, list[float]]:
    """Reference losses per plan, computed once per (model, global batch)."""
    cache: dict[tuple, list[float]] = {}
    result = {}
    for name, (model, fields, extra) in RUNS.items():
        entry = make_plan(model, **fields).plans[0]
        key = (model, entry.global_batch, entry.seq, *reference_args(extra))
        if key not in cache:
            cache[key] = reference_losses(exported[name] / "train_pipeline.py", reference_args(extra))
        result[name] = cache[key]
    return result


@pytest.mark.parametrize("name", list(RUNS))
def test_pipelined_loss_equals_unsplit_model(name, distributed_losses, references):
    got, want = distributed_losses[name], references[name]
    assert len(want) == 3 and len(got) == 3, (got, want)
    # fp32 rounding of the split model's reductions: a few ulps (tiny-gpt's tied head's losses are ~80)
    assert got == pytest.approx(want, abs=1e-5, rel=1e-6)
    if RUNS[name][2] != MOE_ARGS:
        assert got[-1] < got[0]  # it trains


def test_moe_losses_depend_on_the_update(exported, references):
    """Without the optimizer step (lr 0) the MoE losses of steps 2 and 3 move by far more
    than the 1e-5 the distributed runs match within: the match checks the gradients."""
    frozen = reference_losses(exported["moe_expert_parallel"] / "train_pipeline.py", ["--lr", "0"])
    trained = references["moe_expert_parallel"]
    assert frozen[0] == pytest.approx(trained[0], abs=1e-6)
    assert min(abs(a - b) for a, b in zip(frozen[1:], trained[1:])) > 1e-3


def test_moe_block_routes_each_token_to_its_top_k_experts():
    """The MoE layer of the script's blocks against a per-token loop: softmax router, top-k
    renormalised weights, SwiGLU experts, plus the shared expert."""
    import torch
    import torch.nn.functional as F

    from planner.torch_blocks import BlockConfig, MoE

    torch.manual_seed(0)
    cfg = BlockConfig(
        family="llama",
        num_layers=1,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        ffn_hidden_size=64,
        vocab_size=50,
        max_seq_len=16,
        num_experts=4,
        moe_top_k=2,
        expert_ffn_hidden_size=16,
        shared_ffn_hidden_size=24,
    )
    moe = MoE(cfg)
    x = torch.randn(2, 5, 32)
    want = torch.zeros_like(x)
    experts = moe.experts
    for b in range(2):
        for t in range(5):
            v = x[b, t]
            weights, chosen = F.softmax(v @ moe.router.weight.T, -1).topk(2)
            out = moe.shared_experts(v[None])[0]
            for w, e in zip(weights / weights.sum(), chosen):
                out = out + w * experts.w2[e] @ (F.silu(experts.w1[e] @ v) * (experts.w3[e] @ v))
            want[b, t] = out
    assert torch.allclose(moe(x), want, atol=1e-5)


def test_script_embeds_the_blocks_and_the_plan(exported):
    text = (exported["zbv"] / "train_pipeline.py").read_text()
    assert not re.search(r"^(from|import) planner", text, flags=re.M)  # standalone: blocks embedded
    assert "class TransformerBlock(nn.Module):" in text
    namespace = runpy.run_path(str(exported["zbv"] / "train_pipeline.py"), run_name="not_main")
    assert namespace["PLAN"]["chunks"] == [[(0, 0, 1), (3, 3, 4)], [(1, 1, 2), (2, 2, 3)]]
    assert namespace["PLAN"]["torch_schedule"] == "ZBVZeroBubble"
    assert namespace["PLAN"]["dtype"] == "fp32"


def test_schedule_csv_loads_in_torch(exported):
    """The exported order is valid for torch's own runtime loader (format and stage mapping)."""
    from torch.distributed.pipelining.schedules import _Action

    rows = (exported["zb_h2_from_csv"] / "schedule.csv").read_text().splitlines()
    actions = [[_Action.from_str(cell) for cell in row.split(",")] for row in rows]
    assert len(actions) == 2
    assert {a.stage_index for a in actions[0]} == {0} and {a.stage_index for a in actions[1]} == {1}
    assert sum(str(a.computation_type) in ("W", "_ComputationType.BACKWARD_WEIGHT") for a in actions[0]) == 4


@pytest.mark.parametrize(
    "model, fields, words",
    [
        ("tiny-llama", dict(cp=2, seq=64), "context parallelism"),
        ("deepseek-v3", dict(pp=1, stage_layers=[[0, 61]]), "latent attention"),
        ("tiny-moe", dict(tp=2, pp=1, stage_layers=[[0, 6]]), "tensor parallelism"),
        ("tiny-moe", dict(dp=4, ep=4, pp=1, stage_layers=[[0, 6]]), None),
        ("tiny-moe", dict(dp=2, ep=4, pp=1, stage_layers=[[0, 6]]), "ep 4 must divide dp"),
        ("tiny-moe", dict(dp=2, ep=2, pp=1, zero_stage=3, stage_layers=[[0, 6]]), "ZeRO-3 with expert"),
        ("tiny-llama", dict(dp=2, ep=2, pp=1, stage_layers=[[0, 4]]), "dense model"),
        ("tiny-gpt", dict(tp=3, pp=1, stage_layers=[[0, 4]]), "not divisible by tp 3"),
    ],
)
def test_torch_export_refuses(model, fields, words):
    if words is None:  # the accepted neighbour of the refusals around it
        assert "train_pipeline.py" in export_torch(make_plan(model, **fields))
        return
    with pytest.raises(ExportError, match=words):
        export_torch(make_plan(model, **fields))
