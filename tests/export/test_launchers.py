"""The launch scripts the exporters write are complete: the launcher's own argument parser
takes them (torchrun's; DeepSpeed's runner and its per-node launch), with the plan's nodes and
GPUs per node filled in."""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from planner.export import export_plan
from tests.export.export_helpers import imported, make_plan, write_files

torch_run = pytest.importorskip("torch.distributed.run")


def _launcher_arguments(script: str, launcher: str, env: dict[str, str] | None = None) -> list[str]:
    """The words after `launcher` in a launch script, its variables expanded as bash would with
    `env` set: ${VAR:-default} at its default unless `env` sets VAR, $VAR from `env` (else left as it is)."""
    env = env or {}
    text = script[script.index(f"\n{launcher} \\\n") + len(launcher) + 1 :].replace("\\\n", " ")
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m[1], m[2]), text.replace('"$@"', ""))
    return shlex.split(re.sub(r"\$(\w+)", lambda m: env.get(m[1], m[0]), text))


def _torchrun_arguments(script: str) -> list[str]:
    """The words after `torchrun` in a launch script, with its ${VAR:-default}s at their default."""
    return _launcher_arguments(script, "torchrun")


@pytest.mark.parametrize(
    "runtime, launcher",
    [("megatron", "launch_megatron.sh"), ("torchtitan", "launch_torchtitan.sh"), ("torch", "launch_torch.sh")],
)
def test_torchrun_takes_the_launch_script(runtime, launcher, tmp_path, monkeypatch):
    plan = make_plan("tiny-llama", tp=2, pp=2, dp=4, num_microbatches=4, gpus_per_node=8)
    files = export_plan(plan, runtime)
    script = tmp_path / launcher
    script.write_text(files[launcher])
    subprocess.run(["bash", "-n", str(script)], check=True)
    args = torch_run.get_args_parser().parse_args(_torchrun_arguments(files[launcher]))
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "8", 0)
    if runtime == "torchtitan":
        assert args.module and args.training_script == "torchtitan.train"
        assert args.training_script_args[:4] == ["--module", "planner_recipe", "--config", "planner_plan"]
    elif runtime == "torch":  # the exported script's own parser takes what the launcher passes it
        assert args.training_script == "train_pipeline.py"
        (tmp_path / "train_pipeline.py").write_text(files["train_pipeline.py"])
        exported = imported(tmp_path / "train_pipeline.py", "exported_train_pipeline", monkeypatch)
        monkeypatch.setattr(sys, "argv", ["train_pipeline.py", *args.training_script_args])
        script_args = exported.parse_args()
        assert (script_args.device, script_args.backend) == ("cuda", "nccl")
    else:
        assert args.training_script.endswith("/pretrain_gpt.py")


class _Started:
    """Stands in for subprocess.Popen in DeepSpeed's runner: records the command, starts nothing."""

    commands: list[list[str]] = []

    def __init__(self, cmd, env=None):
        self.commands.append(list(cmd))
        self.returncode = 0

    def wait(self) -> int:
        """Done at once, successfully."""
        return 0


def _node_command(runner, words: list[str], monkeypatch) -> list[str]:
    """The per-node command DeepSpeed's runner (`deepspeed WORDS`) starts on this node."""
    _Started.commands = []
    monkeypatch.setattr(runner.subprocess, "Popen", _Started)
    runner.main(words)
    [command] = _Started.commands
    return command


@pytest.mark.parametrize(
    "fields",
    [
        dict(pp=2, dp=8, num_microbatches=4, gpus_per_node=8),  # two nodes of 8
        dict(pp=4, dp=1, num_microbatches=8, stage_layers=[[0, 1], [1, 2], [2, 3], [3, 4]]),  # one node of 4
        dict(pp=1, dp=16, zero_stage=3, stage_layers=[[0, 4]], gpus_per_node=4),  # four nodes of 4, no pipeline
    ],
)
def test_deepspeed_runner_takes_the_launch_script(fields, tmp_path, monkeypatch):
    """DeepSpeed's runner parses the script's command and resolves its hostfile; on every node it
    starts deepspeed.launcher.launch, whose parser and world info give that node the plan's GPUs,
    and the entry's own parser takes the arguments each process gets."""
    runner = pytest.importorskip("deepspeed.launcher.runner")
    from deepspeed.launcher import launch

    plan = make_plan("tiny-llama", **fields)
    entry, cluster = plan.plans[0], plan.cluster
    files = export_plan(plan, "deepspeed")
    folder = write_files(files, tmp_path)
    subprocess.run(["bash", "-n", str(folder / "launch_deepspeed.sh")], check=True)
    nodes = entry.num_gpus // cluster.gpus_per_node
    model_file = "deepspeed_pipeline.py" if entry.pp > 1 else "deepspeed_model.py"
    imported(folder / model_file, Path(model_file).stem, monkeypatch)
    trainer = imported(folder / "train_deepspeed.py", "train_deepspeed", monkeypatch)
    for node in range(nodes):
        env = {"NODE_RANK": str(node), "HERE": str(folder)}
        words = _launcher_arguments(files["launch_deepspeed.sh"], "deepspeed", env)
        command = _node_command(runner, words, monkeypatch)
        monkeypatch.setattr(sys, "argv", command[command.index("deepspeed.launcher.launch") :])
        started = launch.parse_args()
        world = json.loads(base64.urlsafe_b64decode(started.world_info))
        assert len(world) == nodes and sum(map(len, world.values())) == entry.num_gpus == entry.pp * entry.dp
        assert started.node_rank == node and len(list(world.values())[node]) == cluster.gpus_per_node
        assert (started.master_addr, started.master_port) == ("localhost", 6000)
        assert Path(started.training_script) == folder / "train_deepspeed.py"
        args = trainer.parse_args([f"--local_rank={node % cluster.gpus_per_node}", *started.training_script_args])
        assert args.deepspeed and Path(args.deepspeed_config) == folder / "ds_config.json"
