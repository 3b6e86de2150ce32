"""torchtitan export, checked by torchtitan 0.3: its ConfigManager loads the recipe (and
re-validates `Trainer.Config`), the model config validates itself against the parallelism
(`update_from_config`), `ParallelDims` accepts the degrees for the plan's world size, the
model built on the meta device has the planned parameter count, and torchtitan's own stage
placement and module split give every rank the planned layers; the schedule CSV agrees."""

from __future__ import annotations

import sys

import pytest

from export_helpers import make_plan, write_files
from planner.errors import ExportError
from planner.export.torchtitan import export_torchtitan
from planner.plan import virtual_stage

pytest.importorskip("torchtitan", reason="torchtitan not installed (see docs/exporters.md)")
torch = pytest.importorskip("torch")


def per_rank(cuts: list[int], pp: int, vpp: int, schedule: str) -> list:
    """stage_layers (per rank, per chunk) for model-order cut points `cuts` (stage ends)."""
    starts = [0] + cuts[:-1]
    ranks = [[None] * vpp for _ in range(pp)]
    for rank in range(pp):
        for chunk in range(vpp):
            stage = virtual_stage(rank, chunk, pp, schedule)
            ranks[rank][chunk] = [starts[stage], cuts[stage]]
    return ranks if vpp > 1 else [r[0] for r in ranks]


PLANS = {
    "zbv_tp_fsdp": ("llama3-8b", dict(tp=2, pp=4, dp=2, vpp=2, schedule="zbv", num_microbatches=8, seq=4096,
                                      sequence_parallel=True, recompute="full",
                                      stage_layers=per_rank([4, 8, 12, 16, 20, 24, 28, 32], 4, 2, "zbv"))),
    "interleaved_uneven": ("llama3-8b", dict(pp=4, dp=2, vpp=2, schedule="interleaved_1f1b", num_microbatches=8,
                                             stage_layers=per_rank([3, 7, 11, 15, 19, 23, 27, 32], 4, 2, "loop"),
                                             zero_stage=3)),
    "zb_h2_from_csv": ("tiny-llama", dict(pp=2, schedule="zb_h2", dtype="fp32")),
    "no_pipeline_ddp": ("tiny-llama", dict(pp=1, dp=8, num_microbatches=4, stage_layers=[[0, 4]], zero_stage=0,
                                           recompute="selective")),
    "context_parallel": ("llama3-70b", dict(tp=8, cp=2, pp=1, dp=4, num_microbatches=2, seq=8192,
                                            stage_layers=[[0, 80]])),
}


@pytest.fixture
def load_recipe(tmp_path, monkeypatch):
    """Export a plan and load it the way `torchtitan.train` does (module path + function)."""
    from torchtitan.config import ConfigManager

    def load(plan_file):
        folder = write_files(export_torchtitan(plan_file), tmp_path / "titan")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.chdir(folder)
        sys.modules.pop("planner_recipe", None)
        return folder, ConfigManager().parse_args(["--module", "planner_recipe", "--config", "planner_plan"])

    return load


def planner_param_count(spec) -> int:
    from planner.torch_blocks import BlockConfig, Transformer

    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(BlockConfig(**spec.block_fields())).parameters())


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_loads_and_places_layers_as_planned(name, load_recipe):
    from torch.distributed.pipelining.schedules import _Action
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping, _split_module

    model, fields = PLANS[name]
    plan_file = make_plan(model, **fields)
    entry, spec = plan_file.plans[0], plan_file.model
    folder, config = load_recipe(plan_file)

    config.model_spec.model.update_from_config(config=config)  # torchtitan's own model/parallel checks
    dims = ParallelDims.from_config(config.parallelism, world_size=entry.num_gpus)
    assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp) == (entry.dp, entry.tp, entry.pp, entry.cp)
    assert config.training.seq_len == entry.seq
    assert config.training.global_batch_size == entry.global_batch
    with torch.device("meta"):
        built = config.model_spec.model.build()
    assert sum(p.numel() for p in built.parameters()) == planner_param_count(spec)

    if entry.pp == 1:
        return
    parallelism = config.parallelism
    assert config.training.local_batch_size // parallelism.pipeline_parallel_microbatch_size == entry.num_microbatches
    names = parallelism.module_fqns_per_model_part
    csv_rows = (folder / parallelism.pipeline_parallel_schedule_csv).read_text().splitlines()
    for rank in range(entry.pp):
        stages = _get_pp_rank_to_stage_indices_mapping(rank, entry.pp, parallelism.pipeline_parallel_schedule,
                                                       len(names))
        held = []
        for stage in stages:
            layers = [int(k) for k in _split_module(built, names[stage]).layers.keys()]
            held.append((min(layers), max(layers) + 1))
        assert held == list(entry.chunks_of(rank))
        assert {_Action.from_str(a).stage_index for a in csv_rows[rank].split(",")} == set(stages)


def test_torchtitan_recipe_records_provenance(load_recipe):
    folder, _ = load_recipe(make_plan("tiny-llama", pp=2))
    text = (folder / "planner_recipe.py").read_text()
    assert "# planner 0.1.0, costs: analytic" in text and "# predicted: step 1.25 s" in text
    assert "predicted" in (folder / "PLANNER_PROVENANCE.md").read_text()


def test_torchtitan_refuses():
    with pytest.raises(ExportError, match="not a Llama-style"):
        export_torchtitan(make_plan("tiny-gpt"))
    tied = make_plan("tiny-llama")
    tied = tied.model_copy(update={"model": tied.model.model_copy(update={"tie_embeddings": True})})
    with pytest.raises(ExportError, match="weight tying under PP"):
        export_torchtitan(tied)
    with pytest.raises(ExportError, match="recompute differs"):
        export_torchtitan(make_plan("tiny-llama", recompute=["full", "none"]))
    with pytest.raises(ExportError, match="dtype 'fp16'"):
        export_torchtitan(make_plan("tiny-llama", dtype="fp16"))
