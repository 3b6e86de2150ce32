"""Plan -> DeepSpeed: `ds_config.json`, the model (`deepspeed_pipeline.py`, a PipelineModule
whose stages hold exactly the planned layers, or without pipeline parallelism
`deepspeed_model.py`, one module returning the loss), and the launch side
(planner/export/deepspeed_launch.py): `launch_deepspeed.sh`, its `hostfile` and the training
entry `train_deepspeed.py`.

DeepSpeed's layer list counts the embedding and the head as layers: entry 0 is the
embedding, entry i + 1 transformer block i, then the head (for tied embeddings: a final
norm, then the embedding again as a TiedLayerSpec computing the logits). Stage boundaries
in that list are `[0, b_0 + 1, ..., b_{P-2} + 1, len(list)]` for stages ending at block
b_s. When DeepSpeed's own `partition_method="uniform"` yields those boundaries it is used;
otherwise the module sets them explicitly (DeepSpeed 0.19 has no method taking explicit
boundaries, so `PlannedPipelineModule` overrides its `_partition_layers` hook).

DeepSpeed's pipeline engine runs its own 1F1B-like TrainSchedule only, one stage per rank,
without tensor or context parallelism, and refuses ZeRO-2/3 with pipeline parallelism; those
plans are refused here. The JSON carries no provenance key (DeepSpeed would accept unknown
keys silently, but the file stays the plain config); the provenance is the sidecar README.
"""

from __future__ import annotations

import json
import pprint

from planner.errors import ExportError
from planner.export.common import (
    PROVENANCE_FILE,
    Files,
    check_attention_kernel,
    check_moe_mechanisms,
    check_positions,
    check_rules,
    comment_block,
    provenance_readme,
    require_model,
    select_plan,
    summary_lines,
    uniform_recompute,
)
from planner.export.deepspeed_launch import ENTRY_FILE, HOSTFILE, LAUNCH_FILE, launch_files
from planner.export.torch_pp import module_source
from planner.plan import PlanEntry, PlanFile
from planner.runtimes import resolve
from planner.spec import ModelSpec

RUNTIME = "deepspeed"
CONFIG_FILE = "ds_config.json"
MODULE_FILE = "deepspeed_pipeline.py"
MODEL_FILE = "deepspeed_model.py"
TARGET_KEY = "planner_written_for"
"""The config's one key DeepSpeed does not read: the runtime version the export targets."""


def export_deepspeed(plan_file: PlanFile, index: int = 0) -> Files:
    """`ds_config.json`, the model module, the launch script, its hostfile, the training entry
    and the provenance."""
    entry = select_plan(plan_file, index)
    check_attention_kernel(entry, RUNTIME)
    spec = require_model(plan_file, RUNTIME)
    _check(entry, spec)
    check_moe_mechanisms(entry, RUNTIME)
    header = comment_block(summary_lines(plan_file, entry, index, RUNTIME))
    files = {CONFIG_FILE: json.dumps(deepspeed_config(entry), indent=2) + "\n"}
    described = {CONFIG_FILE: "the DeepSpeed config (deepspeed.initialize(config=...))"}
    if entry.pp > 1:
        model_file = MODULE_FILE
        files[model_file] = _pipeline_file(entry, spec, header)
        described[model_file] = (
            "`build_pipeline_module()`: the model as a DeepSpeed PipelineModule cut at the planned stage boundaries"
        )
    else:
        model_file = MODEL_FILE
        files[model_file] = _model_file(entry, spec, header)
        described[model_file] = "`build_model()`: the model as one module whose forward returns the loss"
    files |= launch_files(plan_file, entry, header, CONFIG_FILE, model_file)
    described[LAUNCH_FILE] = (
        f"the `deepspeed` launcher (no ssh: run it on every node) of `{ENTRY_FILE}` on the plan's nodes and GPUs"
    )
    described[HOSTFILE] = "the launcher's hostfile: one line per node, its GPUs as slots"
    described[ENTRY_FILE] = (
        f"the training entry: deepspeed.initialize from `{model_file}` and `{CONFIG_FILE}`, synthetic data"
    )
    files[PROVENANCE_FILE] = provenance_readme(plan_file, entry, index, "DeepSpeed", described, RUNTIME)
    return files


def deepspeed_config(entry: PlanEntry) -> dict:
    """The DeepSpeed JSON config: the runtime version it targets, batch split, ZeRO stage,
    precision, recompute (the optimizer and clipping are placeholders, not part of the plan)."""
    target = resolve(RUNTIME)
    config: dict = {
        TARGET_KEY: f"{target.name}: {target.summary}",
        "train_batch_size": entry.global_batch,
        "train_micro_batch_size_per_gpu": entry.mbs,
        "gradient_accumulation_steps": entry.num_microbatches,
        "zero_optimization": {"stage": entry.zero_stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 3.0e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    if entry.dtype in ("bf16", "fp16"):  # DeepSpeed's precision sections are named after the dtype
        config[entry.dtype] = {"enabled": True}
    if uniform_recompute(entry, RUNTIME) == "full":
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return config


def layer_list_length(spec: ModelSpec) -> int:
    """Entries of the DeepSpeed layer list: embedding, blocks, head (tied: final norm, head)."""
    return spec.num_layers + (3 if spec.tie_embeddings else 2)


def stage_boundaries(entry: PlanEntry, spec: ModelSpec) -> list[int]:
    """DeepSpeed `parts`: where each stage starts in the layer list, then the list's length."""
    ends = [end for _, end in entry.ranges_in_model_order()]
    return [0] + [end + 1 for end in ends[:-1]] + [layer_list_length(spec)]


def uniform_boundaries(num_items: int, num_parts: int) -> list[int]:
    """An even split of `num_items` into `num_parts`, the first `num_items % num_parts` parts
    one larger: DeepSpeed's partition_method="uniform" (tests compare it with DeepSpeed's)."""
    size, extra = divmod(num_items, num_parts)
    if size == 0:
        return [min(p, num_items) for p in range(num_parts + 1)]
    bounds = [0]
    for part in range(num_parts):
        bounds.append(bounds[-1] + size + (1 if part < extra else 0))
    return bounds


def _check(entry: PlanEntry, spec: ModelSpec) -> None:
    if spec.is_moe:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} is a mixture of experts, which this exporter does not "
            "write for DeepSpeed's pipeline engine: its PipelineModule layers are dense, and "
            "DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) returns an auxiliary loss per layer "
            "that the engine's last-stage loss function does not collect"
        )
    check_rules(entry, RUNTIME)
    check_positions(entry, spec, RUNTIME)
    if entry.dtype not in ("bf16", "fp16", "fp32"):
        raise ExportError(f"{RUNTIME}: dtype '{entry.dtype}' is not exported (bf16, fp16, fp32)")


def _blocks_source() -> str:
    """planner/torch_blocks.py to embed after the exported file's own `__future__` import."""
    return module_source("planner.torch_blocks").replace("from __future__ import annotations\n", "").rstrip()


def _recompute_interval(entry: PlanEntry) -> int:
    """1 under full recompute (every transformer block recomputed in the backward pass), else 0."""
    return 1 if uniform_recompute(entry, RUNTIME) == "full" else 0


def _pipeline_file(entry: PlanEntry, spec: ModelSpec, header: str) -> str:
    """`deepspeed_pipeline.py`: the blocks embedded and a PipelineModule cut at the planned stages."""
    parts = stage_boundaries(entry, spec)
    method = "uniform" if parts == uniform_boundaries(layer_list_length(spec), entry.pp) else "planner"
    model = spec.block_fields(tp=1, seq=entry.seq)
    return f'''"""DeepSpeed PipelineModule for a planned layout, written by `planner export --to deepspeed`.

    from deepspeed_pipeline import build_pipeline_module
    engine, *_ = deepspeed.initialize(model=build_pipeline_module(), config="ds_config.json",
                                      model_parameters=...)
    loss = engine.train_batch(data_iter)   # batches of (tokens, next-token targets)

Layer list: [embedding, block 0 .. block {spec.num_layers - 1}, {"final norm, tied head" if spec.tie_embeddings else "head"}].
"""

from __future__ import annotations

{header.rstrip()}

from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

# ---- model blocks: planner/torch_blocks.py, embedded verbatim ----
{_blocks_source()}
# ---- end of model blocks ----

MODEL = {pprint.pformat(model, sort_dicts=False)}
"""BlockConfig arguments of the model."""
NUM_STAGES = {entry.pp}
PARTS = {parts}
"""Planned stage boundaries in the layer list: stage s holds entries PARTS[s]..PARTS[s+1]-1."""
PARTITION_METHOD = "{method}"
"""DeepSpeed's "uniform" when it gives PARTS, else "planner" (PARTS set explicitly)."""
ACTIVATION_CHECKPOINT_INTERVAL = {_recompute_interval(entry)}
"""1: recompute every transformer block in the backward pass (full recompute); 0: keep
activations. Only blocks are checkpointed (DeepSpeed's reentrant checkpoint cannot start at
the embedding, whose integer inputs carry no gradient)."""


class EmbeddingPipe(Embedding):
    """Token (and position) embedding as the first pipeline layer."""


class BlockPipe(TransformerBlock):
    """One transformer block as a pipeline layer."""


class HeadPipe(Head):
    """Final norm and vocabulary projection as the last pipeline layer."""


class FinalNormPipe(nn.Module):
    """The final norm before a tied output projection."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.norm = make_norm(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)


def tied_logits(embedding: EmbeddingPipe, h: torch.Tensor) -> torch.Tensor:
    """Logits through the input embedding's matrix (tied weights)."""
    return F.linear(h, embedding.tok.weight)


def layer_specs(cfg: BlockConfig) -> list:
    """DeepSpeed's layer list for the model."""
    blocks = [LayerSpec(BlockPipe, cfg) for _ in range(cfg.num_layers)]
    if not cfg.tie_embeddings:
        return [LayerSpec(EmbeddingPipe, cfg), *blocks, LayerSpec(HeadPipe, cfg)]
    return [TiedLayerSpec("embed", EmbeddingPipe, cfg, tied_weight_attr="tok.weight"), *blocks,
            LayerSpec(FinalNormPipe, cfg),
            TiedLayerSpec("embed", EmbeddingPipe, cfg, forward_fn=tied_logits, tied_weight_attr="tok.weight")]


class PlannedPipelineModule(PipelineModule):
    """A PipelineModule that, for partition_method="planner", uses the planned PARTS."""

    def _partition_layers(self, method="uniform"):
        if method != "planner":
            return super()._partition_layers(method=method)
        self.parts = list(PARTS)
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


def build_pipeline_module(topology=None) -> PipelineModule:
    """The model as a PipelineModule of NUM_STAGES stages cut as planned."""
    cfg = BlockConfig(**MODEL)
    return PlannedPipelineModule(
        layers=layer_specs(cfg), num_stages=None if topology is not None else NUM_STAGES,
        topology=topology, loss_fn=lm_loss, partition_method=PARTITION_METHOD,
        activation_checkpoint_interval=ACTIVATION_CHECKPOINT_INTERVAL, checkpointable_layers=["BlockPipe"])
'''


def _model_file(entry: PlanEntry, spec: ModelSpec, header: str) -> str:
    """`deepspeed_model.py` (no pipeline parallelism): the blocks embedded and one module for
    DeepSpeed's plain engine, its forward returning the loss."""
    model = spec.block_fields(tp=1, seq=entry.seq)
    return f'''"""The planned model as one module for DeepSpeed's engine, written by `planner export --to deepspeed`.

    from deepspeed_model import build_model
    engine, *_ = deepspeed.initialize(model=build_model(), config="ds_config.json",
                                      model_parameters=...)
    loss = engine(tokens, targets)   # then engine.backward(loss); engine.step()

The plan has no pipeline parallelism, so DeepSpeed's plain engine runs it (its pipeline engine
refuses ZeRO-2/3); build the model inside deepspeed.zero.Init under ZeRO-3.
"""

from __future__ import annotations

{header.rstrip()}

import deepspeed

# ---- model blocks: planner/torch_blocks.py, embedded verbatim ----
{_blocks_source()}
# ---- end of model blocks ----

MODEL = {pprint.pformat(model, sort_dicts=False)}
"""BlockConfig arguments of the model."""
ACTIVATION_CHECKPOINT_INTERVAL = {_recompute_interval(entry)}
"""1: recompute every transformer block in the backward pass (full recompute, through
deepspeed.checkpointing); 0: keep activations."""


class PlannedModel(nn.Module):
    """Embedding, blocks and head (planner/torch_blocks.py's Transformer); forward returns the loss."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.model = Transformer(cfg)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.model.tok_embeddings(tokens)
        for layer in self.model.layers.values():
            h = deepspeed.checkpointing.checkpoint(layer, h) if ACTIVATION_CHECKPOINT_INTERVAL else layer(h)
        return lm_loss(self.model.head(h), targets)


def build_model() -> PlannedModel:
    """The model, whole, as DeepSpeed's engine takes it."""
    return PlannedModel(BlockConfig(**MODEL))
'''
