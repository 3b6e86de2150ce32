"""What the FlashAttention-1-class kernels no exporter's runtime runs share (`--attention flash1`:
FlashAttention-1's CUDA kernel; `--attention triton_fa1`: llm-foundry's Triton FlashAttention): a
fused kernel's memory, a refusal on the GPUs without their rates, and through the CLI: plans priced
with them run on no exported runtime, every exporter refuses them, a runtime named beside them is
refused, and the commands that find the best plan other runtimes run name a kernel each runs."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.model import CostModel, CostOptions
from planner.cost.shapes import Shard
from planner.errors import PlannerError
from planner.runtimes import resolve
from planner.spec import Cluster

KERNELS = [
    ("flash1", "a100-80gb", "FlashAttention-1's CUDA kernel", "megatron"),
    ("triton_fa1", "h100", "llm-foundry's Triton FlashAttention", "torchtitan"),
]
"""Kernel, a GPU it has rates on, the words of the exporters' refusal, a runtime that refuses it."""
NAMES = [kernel for kernel, *_ in KERNELS]
MPT_7B = resolve_model("mpt-7b")


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100"])
def test_memory_is_a_fused_kernels(gpu):
    """Each saves q, k, v, its output and the log-sum-exp, as FlashAttention-2: no score matrix."""
    cluster = Cluster.of(resolve_gpu(gpu), 8)
    shard = Shard(mbs=4, seq=2048)
    saved = {
        a: CostModel(MPT_7B, cluster, CostOptions.of(attention=a)).layer_costs("transformer", shard).activation_bytes
        for a in ("flash2", *NAMES, "unfused")
    }
    assert all(saved[kernel] == saved["flash2"] < saved["unfused"] for kernel in NAMES)


@pytest.mark.parametrize("kernel", NAMES)
@pytest.mark.parametrize("gpu", ["b200", "mi300x"])
def test_gpus_without_a_source_refuse_it(gpu, kernel):
    """No measurement of either kernel on Blackwell or AMD (nor pre-MLIR Triton support)."""
    with pytest.raises(PlannerError, match=f"no measured {kernel}"):
        CostModel(MPT_7B, Cluster.of(resolve_gpu(gpu), 8), CostOptions.of(attention=kernel))


def _plan(cli, gpu: str, path, *extra: str) -> tuple[int, dict | str]:
    request = ("--model", "mpt-7b", "--gpu", gpu, "--gpus", "8", "--global-batch", "48", "--seq", "2048")
    code, out, err = cli("plan", *request, "--json", "-o", str(path), *extra)
    return code, (json.loads(out) if code == 0 else err)


@pytest.mark.parametrize("kernel, gpu, words, _", KERNELS, ids=NAMES)
def test_cli_plans_with_it_and_no_exporter_takes_the_plan(cli, tmp_path, kernel, gpu, words, _):
    code, foreign = _plan(cli, gpu, tmp_path / "foreign.json", "--attention", kernel)
    assert code == 0, foreign
    assert all(plan["runtimes"] == [] and plan["attention"] == kernel for plan in foreign["plans"])
    _, flash2 = _plan(cli, gpu, tmp_path / "flash2.json", "--attention", "flash2")
    assert foreign["plans"][0]["predicted"]["step_time_s"] > flash2["plans"][0]["predicted"]["step_time_s"]
    code, _, err = cli("export", str(tmp_path / "foreign.json"), "--to", "megatron", "-o", str(tmp_path / "out"))
    assert code == 2 and words in err and "--attention flash2" in err


@pytest.mark.parametrize("kernel, gpu, _, runtime", KERNELS, ids=NAMES)
def test_cli_refuses_it_with_a_runtime_that_does_not_run_it(cli, tmp_path, kernel, gpu, _, runtime):
    code, err = _plan(cli, gpu, tmp_path / "plan.json", "--attention", kernel, "--runtime", runtime)
    assert code == 2 and f"--attention {kernel}" in err and f"{runtime} does not run" in err


@pytest.mark.parametrize("kernel, gpu", [(k[0], k[1]) for k in KERNELS], ids=NAMES)
def test_the_hint_for_other_runtimes_names_a_kernel_each_runs(cli, kernel, gpu):
    """The commands that find the best plan megatron, torchtitan, torch and deepspeed run swap the
    user's `--attention`, which each of them refuses, for the runtime's own kernel on the GPU (on
    Hopper Megatron-LM's is cuDNN's), and run."""
    args = ("--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--global-batch", "48", "--seq", "2048")
    code, out, err = cli("plan", *args, "--attention", kernel, "--top", "1")
    assert code == 0, err
    hint = " ".join(out[out.index("no plan above runs on") :].split("\nbreakdown")[0].splitlines())
    commands = [shlex.split(text) for text in re.findall(r"`(planner plan [^`]*)`", hint)]
    chosen = {
        command[command.index("--runtime") + 1]: command[command.index("--attention") + 1] for command in commands
    }
    assert set(chosen) == {"megatron", "torchtitan", "torch", "deepspeed"}
    assert chosen == {name: resolve(name).default_attention(resolve_gpu(gpu)) for name in chosen}
    assert kernel not in chosen.values()
    megatron = next(command for command in commands if "megatron" in command)
    code, _, err = cli(*megatron[1:], "--top", "1")
    assert code == 0, err
