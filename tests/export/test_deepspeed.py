"""DeepSpeed export, checked by DeepSpeed: the JSON by `DeepSpeedConfig` (with a
data-parallel mpu stub), the partition by DeepSpeed's own partitioner, a two-process
CPU run of the exported PipelineModule through `deepspeed.initialize` / `train_batch`, and
two-process CPU runs of the exported launch script itself (DeepSpeed's launcher starting the
exported training entry), with and without pipeline parallelism."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from export_helpers import make_plan, write_files

from planner.cost.memory import total_param_count
from planner.errors import ExportError
from planner.export.deepspeed import export_deepspeed, layer_list_length, stage_boundaries, uniform_boundaries
from planner.runtimes import resolve

deepspeed = pytest.importorskip("deepspeed", reason="deepspeed not installed (see docs/exporters.md)")


class DataParallelMPU:
    """The one mpu method DeepSpeedConfig asks: the data-parallel world size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def load_config(folder: Path, dp: int, monkeypatch):
    from deepspeed.runtime import config as ds_config

    # DeepSpeedConfig reads the global rank before it asks the mpu; this test process has no
    # process group, so report rank 0 (else DeepSpeed falls back to a world of 1).
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    return ds_config.DeepSpeedConfig(str(folder / "ds_config.json"), mpu=DataParallelMPU(dp))


@pytest.mark.parametrize(
    "fields",
    [
        dict(pp=2, dp=4, mbs=2, num_microbatches=8, zero_stage=1, recompute="full"),
        dict(pp=1, dp=8, mbs=1, num_microbatches=4, zero_stage=3, stage_layers=[[0, 4]], dtype="fp16"),
        dict(
            pp=4,
            dp=1,
            mbs=1,
            num_microbatches=16,
            zero_stage=0,
            dtype="fp32",
            stage_layers=[[0, 1], [1, 2], [2, 3], [3, 4]],
        ),
    ],
)
def test_deepspeed_config_accepts_the_batch_split(fields, tmp_path, monkeypatch):
    entry = make_plan("tiny-llama", **fields).plans[0]
    folder = write_files(export_deepspeed(make_plan("tiny-llama", **fields)), tmp_path)
    config = load_config(folder, entry.dp, monkeypatch)
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) == (
        entry.global_batch,
        entry.mbs,
        entry.num_microbatches,
    )
    assert config.zero_optimization_stage == entry.zero_stage
    assert config.bfloat16_config.enabled == (entry.dtype == "bf16")
    assert config.float16_config.enabled == (entry.dtype == "fp16")
    assert (folder / "deepspeed_pipeline.py").exists() == (entry.pp > 1)
    assert (folder / "deepspeed_model.py").exists() == (entry.pp == 1)


@pytest.mark.parametrize(
    "model, cuts",
    [
        ("tiny-llama", [[0, 2], [2, 4]]),
        ("tiny-llama", [[0, 1], [1, 4]]),
        ("tiny-gpt", [[0, 2], [2, 4]]),
        ("llama3-8b", [[0, 7], [7, 15], [15, 23], [23, 32]]),
        ("llama3-8b", [[0, 8], [8, 16], [16, 24], [24, 32]]),
    ],
)
def test_partition_matches_deepspeed_partitioner(model, cuts):
    from deepspeed.runtime.utils import partition_uniform

    plan_file = make_plan(model, pp=len(cuts), stage_layers=cuts, num_microbatches=len(cuts))
    entry, spec = plan_file.plans[0], plan_file.model
    parts = stage_boundaries(entry, spec)
    assert uniform_boundaries(layer_list_length(spec), entry.pp) == partition_uniform(layer_list_length(spec), entry.pp)
    module = export_deepspeed(plan_file)["deepspeed_pipeline.py"]
    method = "uniform" if parts == partition_uniform(layer_list_length(spec), entry.pp) else "planner"
    assert f'PARTITION_METHOD = "{method}"' in module
    # Each stage's blocks: boundaries shifted by the embedding entry at the list's head.
    for stage, (start, end) in enumerate(cuts):
        blocks = range(max(parts[stage], 1) - 1, min(parts[stage + 1], spec.num_layers + 1) - 1)
        assert (blocks.start, blocks.stop) == (start, end)


def test_exported_pipeline_trains_in_deepspeed(tmp_path):
    """Tied embeddings on both stages, uneven cut (explicit parts), full recompute."""
    plan_file = make_plan("tiny-gpt", pp=2, dp=1, stage_layers=[[0, 1], [1, 4]], recompute="full")
    folder = write_files(export_deepspeed(plan_file), tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLAN_SEQ": str(plan_file.plans[0].seq)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(Path(__file__).with_name("deepspeed_train.py")),
    ]
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    ranks = {r: json.loads((folder / f"result-rank{r}.json").read_text()) for r in (0, 1)}
    assert ranks[0]["parts"] == ranks[1]["parts"] == [0, 2, 7]
    assert ranks[0]["layers"] == ["EmbeddingPipe", "BlockPipe"]
    assert ranks[1]["layers"] == ["BlockPipe"] * 3 + ["FinalNormPipe", "partial"]  # partial: tied head
    assert all(math.isfinite(x) for x in ranks[1]["losses"])


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_config(folder: Path) -> Path:
    """The exported config for a CPU run: fp32 (no bf16 kernels needed), torch's AdamW (DeepSpeed's
    fused Adam is CUDA); written beside it, so the launch script is run as exported."""
    config = json.loads((folder / "ds_config.json").read_text())
    config.pop("bf16", None)
    config.pop("fp16", None)
    config["optimizer"]["params"]["torch_adam"] = True
    path = folder / "cpu_config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "model, fields",
    [
        ("tiny-llama", dict(pp=2, dp=1, zero_stage=0)),  # DeepSpeed's pipeline engine
        ("tiny-gpt", dict(pp=1, dp=2, zero_stage=3, stage_layers=[[0, 4]], recompute="full")),  # plain engine
    ],
)
def test_launch_script_trains_on_the_planned_ranks(model, fields, tmp_path):
    """`bash launch_deepspeed.sh` as exported (one node of two CPU processes): DeepSpeed's launcher
    starts the training entry on every planned rank, and the engine it builds has the plan's
    world size, pipeline stages, data-parallel size and ZeRO stage, then trains two steps."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("deepspeed", path=str(bin_dir)) is None:
        pytest.skip("DeepSpeed's `deepspeed` launcher is not beside this Python")
    plan_file = make_plan(model, **fields)
    entry = plan_file.plans[0]
    folder = write_files(export_deepspeed(plan_file), tmp_path)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": str(free_port()),
    }
    env.pop("NODE_RANK", None)
    env.pop("MASTER_ADDR", None)
    extra = ["--steps", "2", "--deepspeed_config", str(cpu_config(folder))]
    done = subprocess.run(
        ["bash", str(folder / "launch_deepspeed.sh"), *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    engine = re.search(r"world size (\d+), pipeline stages (\d+), data parallel (\d+), ZeRO stage (\d+)", done.stdout)
    assert engine is not None, done.stdout[-3000:]
    assert tuple(map(int, engine.groups())) == (entry.num_gpus, entry.pp, entry.dp, entry.zero_stage)
    losses = [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", done.stdout, flags=re.MULTILINE)]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_model_module_builds_the_model(model, tmp_path, monkeypatch):
    """Without pipeline parallelism `deepspeed_model.py` builds the whole model, a tied matrix once."""
    import torch  # deepspeed, present here, needs it

    plan_file = make_plan(model, pp=1, dp=2, stage_layers=[[0, 4]])
    folder = write_files(export_deepspeed(plan_file), tmp_path)
    spec = importlib.util.spec_from_file_location("deepspeed_model", folder / "deepspeed_model.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "deepspeed_model", module)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        built = module.build_model()
    assert sum(p.numel() for p in built.parameters()) == total_param_count(plan_file.model)


@pytest.mark.parametrize(
    "fields",
    [
        dict(pp=2, dp=4, num_microbatches=4),
        dict(pp=1, dp=8, zero_stage=3, stage_layers=[[0, 4]], gpus_per_node=4),
    ],
)
def test_every_file_names_the_runtime_version(fields):
    """Each written file says which DeepSpeed version it targets (planner/runtimes/deepspeed.py),
    the JSON config too (in a key DeepSpeedConfig ignores: the config test above loads it)."""
    target = resolve("deepspeed")
    files = export_deepspeed(make_plan("tiny-llama", **fields))
    assert {"launch_deepspeed.sh", "hostfile", "train_deepspeed.py", "ds_config.json"} <= set(files)
    for name, text in files.items():
        assert f"{target.name}: {target.summary}" in text, name
    assert any(target.name in value for value in json.loads(files["ds_config.json"]).values() if isinstance(value, str))


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(schedule="gpipe"), "gpipe"),
        (dict(schedule="interleaved_1f1b", vpp=2, stage_layers=[[[0, 1], [2, 3]], [[1, 2], [3, 4]]]), "interleaved"),
        (dict(schedule="zb_h1"), "zb_h1"),
        (dict(zero_stage=2), "ZeRO-2 with pipeline"),
        (dict(zero_stage=3), "ZeRO-3 with pipeline"),
        (dict(tp=2), "needs Megatron-DeepSpeed"),
        (dict(recompute="selective"), "selective"),
    ],
)
def test_deepspeed_refuses(fields, words):
    with pytest.raises(ExportError, match=words):
        export_deepspeed(make_plan("tiny-llama", **fields))


@pytest.mark.parametrize(
    "fields",
    [
        dict(schedule="1f1b", stage_layers=[[0, 3], [3, 6]]),  # otherwise runnable: 1F1B, ZeRO-1, no TP
        dict(tp=2, dp=2, ep=2, etp=1, pp=1, stage_layers=[[0, 6]]),  # the MoE reason comes first, alone
    ],
)
def test_deepspeed_refuses_a_mixture_of_experts_in_one_line(fields):
    with pytest.raises(ExportError) as refused:
        export_deepspeed(make_plan("tiny-moe", **fields))
    message = str(refused.value)
    assert "mixture of experts" in message and "tensor" not in message and "\n" not in message
