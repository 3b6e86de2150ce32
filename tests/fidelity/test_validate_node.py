"""`scripts/validate_node.sh` (planner/fidelity/validate_node.py): profile, plan, export, run
and compare on one node. CI runs the whole flow on 2 CPU processes (tiny-llama, seq 64,
3 steps): parameters per rank are compared exactly, step times are reported, not asserted.
The per-rank parameter counts are checked against torch modules built independently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.fidelity.validate_node import (
    LEGEND,
    NodeRequest,
    compare,
    format_report,
    rank_params,
    run,
    tp_degrees,
)
from planner.plan import ClusterSummary, MemoryBreakdown, PlanEntry, PlanFile, Predicted

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _plan(model: str, **fields) -> PlanFile:
    entry = dict(
        tp=1,
        pp=2,
        dp=1,
        mbs=1,
        num_microbatches=4,
        global_batch=4,
        seq=64,
        schedule="1f1b",
        stage_layers=[[0, 1], [1, 4]],
        zero_stage=1,
        dtype="bf16",
    )
    entry.update(fields)
    predicted = Predicted(
        step_time_s=2.0,
        tokens_per_s=1.0,
        mfu=0.1,
        bubble_fraction=0.1,
        memory_gb_per_stage=[3.0] * entry["pp"],
        memory_breakdown_gb=MemoryBreakdown(weights=0, grads=0, optimizer=0, activations=0, other=0),
    )
    plan = PlanEntry(**entry, predicted=predicted)
    return PlanFile(
        plans=[plan],
        model=resolve_model(model),
        planner_version="",
        cost_source="analytic",
        cluster=ClusterSummary(gpu="h100", num_gpus=plan.num_gpus, gpus_per_node=8),
    )


def _torch_stage_params(model: str, first: int, end: int, embedding: bool, head: bool) -> int:
    """Parameters of torch_blocks modules holding layers [first, end) (+ embedding, head)."""
    from planner.torch_blocks import BlockConfig, Embedding, Head, TransformerBlock

    cfg = BlockConfig(**resolve_model(model).block_fields())
    with torch.device("meta"):
        modules = [TransformerBlock(cfg) for _ in range(first, end)]
        modules += [Embedding(cfg)] if embedding else []
        modules += [Head(cfg)] if head else []
    return sum(p.numel() for m in modules for p in m.parameters())


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_rank_params_are_the_modules_of_each_stage(model):
    plan = _plan(model).plans[0]
    assert rank_params(resolve_model(model), plan, 0) == _torch_stage_params(model, 0, 1, True, False)
    # the last rank holds the head; a tied head on another rank than the embedding is a copy
    assert rank_params(resolve_model(model), plan, 1) == _torch_stage_params(model, 1, 4, False, True)


def test_v_schedule_puts_embedding_and_head_on_rank_zero():
    plan = _plan("tiny-llama", schedule="zbv", vpp=2, stage_layers=[[[0, 1], [3, 4]], [[1, 2], [2, 3]]]).plans[0]
    spec = resolve_model("tiny-llama")
    assert rank_params(spec, plan, 0) == _torch_stage_params("tiny-llama", 0, 2, True, True)
    assert rank_params(spec, plan, 1) == _torch_stage_params("tiny-llama", 0, 2, False, False)


def test_tensor_parallel_shards_vocab_for_planner_not_for_the_script():
    plan = _plan("tiny-llama", tp=2, pp=1, stage_layers=[[0, 4]]).plans[0]
    spec = resolve_model("tiny-llama")
    vocab_rows = spec.vocab_size * spec.hidden_size
    assert rank_params(spec, plan, 0, vocab_parallel=False) - rank_params(spec, plan, 0) == vocab_rows


def test_report_table_flags_what_differs():
    plan_file = _plan("tiny-llama")
    spec = resolve_model("tiny-llama")
    entry = plan_file.plans[0]
    reports = [
        {
            "rank": 0,
            "pp_rank": 0,
            "params": rank_params(spec, entry, 0),
            "step_time_s": [9.0, 1.0, 3.0],
            "peak_allocated_bytes": 2**30,
        },
        {"rank": 1, "pp_rank": 1, "params": 7, "step_time_s": [4.0], "peak_allocated_bytes": None},
    ]
    rows = compare(plan_file, reports)
    assert rows[0].measured_step_s == 2.0  # median of steps 2..K
    assert rows[0].step_error == pytest.approx(0.0) and rows[0].measured_peak_gib == 1.0
    assert rows[1].measured_step_s == 4.0 and rows[1].measured_peak_gib is None
    text = format_report(plan_file, rows)
    assert "exact" in text.splitlines()[2] and "DIFFERENT" in text.splitlines()[3]
    assert text.endswith(LEGEND)


def test_tp_degrees_divide_node_and_heads():
    assert tp_degrees(resolve_model("tiny-llama"), 8) == [1, 2]  # 4 heads, 2 KV heads
    assert tp_degrees(resolve_model("llama3-8b"), 8) == [1, 2, 4, 8]


@pytest.mark.slow
def test_two_cpu_processes_end_to_end(tmp_path):
    lines: list[str] = []
    request = NodeRequest(
        model="tiny-llama",
        nproc=2,
        global_batch=4,
        seq=64,
        device="cpu",
        dtype="fp32",
        steps=3,
        warmup=0,
        repeats=1,
        max_collective_bytes=16384,
        workdir=tmp_path,
    )
    record = run(request, echo=lines.append)
    print("\n".join(lines))  # step times: reported, not asserted
    assert len(record["ranks"]) == 2
    for rank in record["ranks"]:
        assert rank["measured_params"] == rank["script_params"]  # exact, whatever layout was planned
        assert rank["predicted_step_s"] > 0 and rank["measured_step_s"] > 0
        assert rank["measured_peak_gib"] is None  # CPU: no allocator peak
    saved = json.loads((tmp_path / "validate_node.json").read_text())
    assert saved["ranks"] == record["ranks"] and saved["plan"]["num_microbatches"] >= 1
    assert {"profile layers", "profile collectives", "plan", "export", "run"} == set(saved["commands"])
    assert "How to read this table" in "\n".join(lines)


def test_shell_wrapper_passes_arguments_through(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [str(ROOT / "scripts" / "validate_node.sh"), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "--nproc" in done.stdout and "--global-batch" in done.stdout
