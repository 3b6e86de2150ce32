"""The launch scripts the exporters write are complete: torchrun's own argument parser takes
them, with the plan's nodes and GPUs per node filled in."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from planner.export import export_plan
from tests.export.export_helpers import make_plan

torch_run = pytest.importorskip("torch.distributed.run")


def _torchrun_arguments(script: str) -> list[str]:
    """The words after `torchrun` in a launch script, with its ${VAR:-default}s at their default."""
    text = script[script.index("torchrun \\\n") + len("torchrun") :].replace("\\\n", " ")
    words = shlex.split(text.replace('"$@"', ""))
    return [
        w.replace("${NODE_RANK:-0}", "0")
        .replace("${MASTER_ADDR:-localhost}", "localhost")
        .replace("${MASTER_PORT:-6000}", "6000")
        for w in words
    ]


@pytest.mark.parametrize(
    "runtime, launcher", [("megatron", "launch_megatron.sh"), ("torchtitan", "launch_torchtitan.sh")]
)
def test_torchrun_takes_the_launch_script(runtime, launcher, tmp_path):
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
    else:
        assert args.training_script.endswith("/pretrain_gpt.py")
