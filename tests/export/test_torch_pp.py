"""The exported torch.distributed.pipelining script trains: two processes on CPU (gloo),
launched by torchrun, give per step the loss of the unsplit model trained in one process
on the same data from the same initial weights (fp32, SGD, within 1e-5).

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

# name -> (model, plan fields, extra script arguments); every plan runs on 2 processes.
RUNS = {
    "gpipe": ("tiny-llama", dict(schedule="gpipe"), []),
    "1f1b": ("tiny-llama", dict(schedule="1f1b", stage_layers=[[0, 1], [1, 4]]), []),
    "interleaved_1f1b": ("tiny-llama", dict(schedule="interleaved_1f1b", vpp=2, stage_layers=LOOP_V2), []),
    "interleaved_1f1b_from_csv": ("tiny-llama", dict(schedule="interleaved_1f1b", vpp=2, stage_layers=LOOP_V2),
                                  ["--schedule-csv", "schedule.csv"]),
    "looped_bfs": ("tiny-llama", dict(schedule="looped_bfs", vpp=2, stage_layers=LOOP_V2), []),
    "zb_h1_interleaved": ("tiny-llama", dict(schedule="zb_h1", vpp=2, stage_layers=LOOP_V2), []),
    "zb_h2_from_csv": ("tiny-llama", dict(schedule="zb_h2"), []),
    "zbv": ("tiny-llama", dict(schedule="zbv", vpp=2, stage_layers=V_SHAPE), []),
    "dualpipev": ("tiny-llama", dict(schedule="dualpipev", vpp=2, stage_layers=V_SHAPE), []),
    "gpt_tied_across_ranks": ("tiny-gpt", dict(schedule="1f1b", stage_layers=[[0, 3], [3, 4]]), []),
    "gpt_tied_on_one_rank_zbv": ("tiny-gpt", dict(schedule="zbv", vpp=2, stage_layers=V_SHAPE), []),
    "tensor_parallel_full_recompute": ("tiny-llama", dict(tp=2, pp=1, num_microbatches=2, stage_layers=[[0, 4]],
                                                          recompute="full"), []),
    "gpt_fsdp_zero3": ("tiny-gpt", dict(dp=2, pp=1, num_microbatches=2, zero_stage=3, stage_layers=[[0, 4]]), []),
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
        assert plan_file.plans[0].num_gpus == 2
        folders[name] = write_files(export_torch(plan_file), root / name)
    return folders


@pytest.fixture(scope="module")
def distributed_losses(exported) -> dict[str, list[float]]:
    """Every script, two processes each, in one torchrun launch."""
    items = ["|".join([str(exported[name] / "train_pipeline.py"),
                       *[str(exported[name] / a) if a.endswith(".csv") else a for a in extra]])
             for name, (_, _, extra) in RUNS.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).with_name("run_scripts.py")), *TRAIN_ARGS, "--", *items]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    sections = re.split(r"^=== (.*)$", done.stdout, flags=re.M)[1:]
    by_script = {item.split("|")[0]: losses_of(text) for item, text in zip(sections[::2], sections[1::2])}
    return {name: by_script[str(exported[name] / "train_pipeline.py")] for name in RUNS}


def reference_losses(script: Path) -> list[float]:
    """The script's unsplit single-process run (`--reference`), in this process."""
    out = io.StringIO()
    argv = sys.argv
    try:
        sys.argv = [str(script), "--reference", *TRAIN_ARGS]
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
    for name, (model, fields, _) in RUNS.items():
        entry = make_plan(model, **fields).plans[0]
        key = (model, entry.global_batch, entry.seq)
        if key not in cache:
            cache[key] = reference_losses(exported[name] / "train_pipeline.py")
        result[name] = cache[key]
    return result


@pytest.mark.parametrize("name", list(RUNS))
def test_pipelined_loss_equals_unsplit_model(name, distributed_losses, references):
    got, want = distributed_losses[name], references[name]
    assert len(want) == 3 and len(got) == 3, (got, want)
    assert got == pytest.approx(want, abs=1e-5, rel=0)
    assert got[-1] < got[0]  # it trains


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


@pytest.mark.parametrize("model, fields, words", [
    ("tiny-llama", dict(cp=2, seq=64), "context parallelism"),
    ("mixtral-8x7b", dict(pp=1, stage_layers=[[0, 32]]), "mixture of experts"),
    ("tiny-gpt", dict(tp=3, pp=1, stage_layers=[[0, 4]]), "not divisible by tp 3"),
])
def test_torch_export_refuses(model, fields, words):
    with pytest.raises(ExportError, match=words):
        export_torch(make_plan(model, **fields))
