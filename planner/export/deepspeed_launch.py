"""The launch side of the DeepSpeed export: `launch_deepspeed.sh`, its `hostfile` and the
training entry `train_deepspeed.py` it starts.

The script runs DeepSpeed's own launcher (`deepspeed`, deepspeed/launcher/runner.py) the way
DeepSpeed's getting-started guide launches without passwordless SSH: once on every node, with
`--hostfile --no_ssh --node_rank --master_addr --master_port`, so it starts like the torchrun
scripts of the other exports (NODE_RANK, MASTER_ADDR, MASTER_PORT from the environment). The
hostfile gives the node count and GPUs per node (`slots`); with `--no_ssh` its host names are
labels only. `--num_nodes` / `--num_gpus` repeat the plan's shape on the command line.

The entry parses DeepSpeed's own arguments (`deepspeed.add_config_arguments`: `--deepspeed
--deepspeed_config`) and the launcher's `--local_rank`, builds the exported model, calls
`deepspeed.initialize(args=...)` and trains on synthetic tokens (a placeholder, not part of the
plan) for `--steps` optimizer steps: `engine.train_batch` with pipeline parallelism, else the
engine's forward, backward and step per micro-batch.
"""

from __future__ import annotations

from pathlib import PurePath

from planner.export.common import Files, launch_preamble, node_shape
from planner.plan import PlanEntry, PlanFile

LAUNCH_FILE = "launch_deepspeed.sh"
HOSTFILE = "hostfile"
ENTRY_FILE = "train_deepspeed.py"
PLACEHOLDER_STEPS = 1000
"""The entry's default run length (a placeholder, as Megatron's `--train-iters` is there)."""


def launch_files(plan_file: PlanFile, entry: PlanEntry, header: str, config_file: str, model_file: str) -> Files:
    """The launch script, its hostfile and the training entry, each starting with `header`."""
    return {
        LAUNCH_FILE: launch_script(plan_file, entry, header, config_file),
        HOSTFILE: hostfile(plan_file, entry, header),
        ENTRY_FILE: entry_script(entry, header, config_file, model_file),
    }


def hostfile(plan_file: PlanFile, entry: PlanEntry, header: str) -> str:
    """DeepSpeed's hostfile: `node-<i> slots=<GPUs per node>` for each node of the plan."""
    nodes, per_node = node_shape(plan_file, entry)
    lines = [
        f"# DeepSpeed hostfile for {LAUNCH_FILE}: {nodes} node(s) x {per_node} GPUs.",
        "# With --no_ssh the names are labels: line i is the node started with NODE_RANK=i. To let",
        "# DeepSpeed start every node over ssh (pdsh) instead, write the real host names here and run",
        "# the launcher on node 0 without --no_ssh and --node_rank.",
        "#",
    ]
    nodes_lines = [f"node-{node} slots={per_node}" for node in range(nodes)]
    return "\n".join(lines) + "\n" + header + "\n".join(nodes_lines) + "\n"


def launch_script(plan_file: PlanFile, entry: PlanEntry, header: str, config_file: str) -> str:
    """The bash script that runs DeepSpeed's launcher on this node for the plan's nodes and GPUs."""
    nodes, per_node = node_shape(plan_file, entry)
    note = f"# Arguments after the script's name go to {ENTRY_FILE} (e.g. --steps 100).\n"
    return f"""{launch_preamble(plan_file, entry, "the DeepSpeed training entry", header, note)}HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
deepspeed \\
    --hostfile "$HERE/{HOSTFILE}" \\
    --no_ssh \\
    --node_rank "${{NODE_RANK:-0}}" \\
    --master_addr "${{MASTER_ADDR:-localhost}}" \\
    --master_port "${{MASTER_PORT:-6000}}" \\
    --num_nodes {nodes} \\
    --num_gpus {per_node} \\
    "$HERE/{ENTRY_FILE}" \\
    --deepspeed \\
    --deepspeed_config "$HERE/{config_file}" \\
    "$@"
"""


def entry_script(entry: PlanEntry, header: str, config_file: str, model_file: str) -> str:
    """`train_deepspeed.py`: the engine from the exported model and config, trained on synthetic data."""
    module = PurePath(model_file).stem
    if entry.pp > 1:
        build, step = _PIPELINE_BUILD, _PIPELINE_STEP
        imports = f"from {module} import MODEL, build_pipeline_module"
    else:
        build, step = _MODEL_BUILD, _MODEL_STEP
        imports = f"import json\n\nfrom {module} import MODEL, build_model"
    return f'''"""DeepSpeed training entry for a planned layout, written by `planner export --to deepspeed`.

    bash {LAUNCH_FILE}   # on every node, with NODE_RANK and MASTER_ADDR set

DeepSpeed's launcher starts one process per GPU running this file with `--deepspeed
--deepspeed_config {config_file}`. Each builds the model of {model_file}, calls
deepspeed.initialize and trains for --steps optimizer steps. The data are placeholders,
not part of the plan: random tokens of the model's vocabulary; replace `batches()` with your
data loader.
"""

from __future__ import annotations

{header.rstrip()}

import argparse

import deepspeed
import torch
import torch.distributed as dist

{imports}

SEQ = {entry.seq}
"""Tokens per sequence (the plan's seq)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """DeepSpeed's arguments (--deepspeed, --deepspeed_config), the launcher's --local_rank, the run's length."""
    parser = argparse.ArgumentParser(description="DeepSpeed training entry for a planned layout")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by DeepSpeed's launcher")
    parser.add_argument("--steps", type=int, default={PLACEHOLDER_STEPS}, help="optimizer steps (a placeholder)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    return deepspeed.add_config_arguments(parser).parse_args(argv)


def batches(micro_batch: int, seed: int):
    """Endless (tokens, next-token targets) micro-batches of random tokens (placeholder data)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(0, MODEL["vocab_size"], (micro_batch, SEQ + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]
{build}{step}

def main() -> None:
    """Build the engine from the exported model and config, report its layout, train --steps steps,
    then leave the process group."""
    args = parse_args()
    deepspeed.init_distributed()
    model = build(args)
    engine, *_ = deepspeed.initialize(
        args=args, model=model, model_parameters=[p for p in model.parameters() if p.requires_grad]
    )
    stages = getattr(engine, "num_stages", 1)
    if dist.get_rank() == 0:
        print(
            f"DeepSpeed {{deepspeed.__version__}} engine: world size {{dist.get_world_size()}}, "
            f"pipeline stages {{stages}}, data parallel {{engine.dp_world_size}}, "
            f"ZeRO stage {{engine.zero_optimization_stage()}}",
            flush=True,
        )
    # the first and last pipeline stages of one replica read the same tokens: seed by data-parallel rank
    data = batches(engine.train_micro_batch_size_per_gpu(), args.seed + dist.get_rank(engine.data_parallel_group))
    for number in range(1, args.steps + 1):
        loss = train_step(engine, data)
        if dist.get_rank() == 0:
            print(f"step {{number}}: loss {{loss:.4f}}", flush=True)
    dist.barrier()  # every rank done before the process group goes: a clean exit on every rank
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


_PIPELINE_BUILD = '''

def build(args: argparse.Namespace) -> torch.nn.Module:
    """The exported PipelineModule (each rank builds its own stage's layers)."""
    return build_pipeline_module()
'''

_PIPELINE_STEP = '''

def train_step(engine, data) -> float:
    """One optimizer step: DeepSpeed's pipeline schedule over the step's micro-batches; the loss
    averaged over micro-batches and data-parallel replicas."""
    return float(engine.train_batch(data))
'''

_MODEL_BUILD = '''

def build(args: argparse.Namespace) -> torch.nn.Module:
    """The exported model, built inside deepspeed.zero.Init under ZeRO-3 (each rank keeps its shard)."""
    with open(args.deepspeed_config) as file:
        stage = json.load(file).get("zero_optimization", {}).get("stage", 0)
    with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config, enabled=stage == 3):
        return build_model()
'''

_MODEL_STEP = '''

def train_step(engine, data) -> float:
    """One optimizer step: forward, backward and engine.step() per micro-batch (DeepSpeed steps the
    optimizer at the accumulation boundary); the loss averaged over micro-batches and ranks."""
    total = torch.zeros((), device=engine.device)
    for _ in range(engine.gradient_accumulation_steps()):
        tokens, targets = next(data)
        loss = engine(tokens.to(engine.device), targets.to(engine.device))
        engine.backward(loss)
        engine.step()
        total += loss.detach().float()
    dist.all_reduce(total)
    return total.item() / (engine.gradient_accumulation_steps() * dist.get_world_size())
'''
