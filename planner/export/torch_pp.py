"""Plan -> a standalone torch.distributed.pipelining training script (`train_pipeline.py`).

The script is `torch_script_template.py` with two marked regions filled in: the model
blocks (planner/torch_blocks.py, embedded verbatim but for its `__future__` import, which
the template already has) and the plan (`MODEL`, `PLAN` dictionaries). With pipeline
parallelism the per-rank action order of the planned schedule is also written as
`schedule.csv` (torch's compute-only CSV); the script runs it when torch has no class for
the schedule (zb_h2), or on request (`--schedule-csv`).

A mixture-of-experts model trains with expert parallelism over the data-parallel ranks
(`ep` divides `dp`; each expert-parallel group holds every expert once and exchanges tokens
by all-to-all); experts are not tensor-parallel in the script (etp 1).
"""

from __future__ import annotations

import importlib.util
import pprint
from pathlib import Path

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
    replan_for,
    require_model,
    select_plan,
    summary_lines,
    torchrun_script,
)
from planner.plan import PlanEntry, PlanFile
from planner.schedule.registry import virtual_stage
from planner.spec import ModelSpec

RUNTIME = "torch"
SCRIPT_FILE = "train_pipeline.py"
CSV_FILE = "schedule.csv"
LAUNCH_FILE = "launch_torch.sh"
DTYPES = ("fp32", "bf16", "fp16")
_BLOCKS = ("# >>> planner: model blocks\n", "# <<< planner: model blocks\n")
_PLAN = ("# >>> planner: plan\n", "# <<< planner: plan\n")


def export_torch(plan_file: PlanFile, index: int = 0) -> Files:
    """`train_pipeline.py` (+ `schedule.csv` with pipeline parallelism) and the provenance."""
    entry = select_plan(plan_file, index)
    check_attention_kernel(entry, RUNTIME)
    spec = require_model(plan_file, RUNTIME)
    check_moe_mechanisms(entry, RUNTIME)
    _check(entry, spec)
    torch_schedule, csv_text = _schedule(entry)
    plan = script_plan(entry, torch_schedule, CSV_FILE if torch_schedule is None else None)
    script = render_script(spec, plan, summary_lines(plan_file, entry, index, RUNTIME))
    files = {SCRIPT_FILE: script, LAUNCH_FILE: _launch_file(plan_file, entry, index)}
    described = {
        SCRIPT_FILE: f"the training script (`python {SCRIPT_FILE} --reference` trains the unsplit model on the "
        "same data; on one CPU node: `torchrun --nproc-per-node WORLD " + SCRIPT_FILE + "`)",
        LAUNCH_FILE: "torchrun launch of the training script on the GPUs of every node",
    }
    if csv_text is not None:
        files[CSV_FILE] = csv_text
        described[CSV_FILE] = (
            "the planned per-rank action order (torch compute-only CSV), run with "
            f"`--schedule-csv {CSV_FILE}`" + (" (the default here)" if torch_schedule is None else "")
        )
    files[PROVENANCE_FILE] = provenance_readme(
        plan_file, entry, index, "torch.distributed.pipelining", described, RUNTIME
    )
    return files


def _launch_file(plan_file: PlanFile, entry: PlanEntry, index: int) -> str:
    """The torchrun launch of the training script on the GPUs of every node."""
    header = comment_block(summary_lines(plan_file, entry, index, RUNTIME))
    setup = 'cd "$(dirname "${BASH_SOURCE[0]}")"\n'
    return torchrun_script(
        plan_file,
        entry,
        header,
        "the torch.distributed.pipelining training script",
        setup,
        [SCRIPT_FILE, "--device", "cuda", "--backend", "nccl"],
    )


def script_plan(entry: PlanEntry, torch_schedule: str | None, schedule_csv: str | None) -> dict:
    """The `PLAN` dictionary the script reads: degrees, batching, schedule and placement."""
    num_stages = entry.pp * entry.vpp
    stage_ranks = [0] * num_stages
    chunks = []
    for rank in range(entry.pp):
        mine = []
        for chunk, (first, end) in enumerate(entry.chunks_of(rank)):
            stage = virtual_stage(rank, chunk, entry.pp, entry.schedule)
            stage_ranks[stage] = rank
            mine.append((stage, first, end))
        chunks.append(mine)
    return {
        "tp": entry.tp,
        "pp": entry.pp,
        "dp": entry.dp,
        "ep": entry.ep,
        "vpp": entry.vpp,
        "mbs": entry.mbs,
        "num_microbatches": entry.num_microbatches,
        "global_batch": entry.global_batch,
        "seq": entry.seq,
        "dtype": entry.dtype,
        "zero_stage": entry.zero_stage,
        "schedule": entry.schedule,
        "torch_schedule": torch_schedule,
        "schedule_csv": schedule_csv,
        "recompute": [entry.recompute_of(r) for r in range(entry.pp)],
        "chunks": chunks,
        "stage_ranks": stage_ranks,
    }


def render_script(spec: ModelSpec, plan: dict, header: list[str]) -> str:
    """The template with the model blocks and the plan filled in, provenance on top."""
    template = module_source("planner.export.torch_script_template")
    blocks = module_source("planner.torch_blocks")
    blocks = blocks.replace("from __future__ import annotations\n", "")
    model = spec.block_fields(tp=1, seq=plan["seq"]) | moe_block_fields(spec)
    filled = _replace_region(
        template,
        _BLOCKS,
        (
            "# ---- model blocks: planner/torch_blocks.py, embedded verbatim ----\n"
            f"{blocks.rstrip()}\n# ---- end of model blocks ----\n"
        ),
    )
    filled = _replace_region(
        filled,
        _PLAN,
        (
            f"MODEL = {pprint.pformat(model, sort_dicts=False)}\n"
            '"""BlockConfig arguments of the unsharded model."""\n'
            f"PLAN = {pprint.pformat(plan, sort_dicts=False, width=100)}\n"
            '"""The layout: degrees, micro-batching, schedule, and per rank the (virtual stage, first\n'
            'layer, end layer) of each chunk."""\n'
        ),
    )
    return "#!/usr/bin/env python3\n# Written by `planner export --to torch`.\n" + comment_block(header) + filled


def moe_block_fields(spec: ModelSpec) -> dict:
    """BlockConfig's mixture-of-experts arguments for `spec`, its router's included (none for
    a dense model)."""
    if not spec.is_moe:
        return {}
    return {
        "num_experts": spec.num_experts,
        "moe_top_k": spec.moe_top_k,
        "expert_ffn_hidden_size": spec.expert_ffn_hidden_size,
        "shared_ffn_hidden_size": spec.shared_ffn_width,
        "first_dense_layers": spec.first_dense_layers,
        "moe_layer_freq": spec.moe_layer_freq,
        "moe_score_function": spec.moe_score_function,
        "moe_norm_topk_prob": spec.moe_norm_topk_prob,
        "moe_routed_scaling_factor": spec.moe_routed_scaling_factor,
        "moe_shared_expert_gate": spec.moe_shared_expert_gate,
    }


def module_source(name: str) -> str:
    """The source text of module `name`, found without importing it (no torch needed)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin).read_text()


def _replace_region(text: str, markers: tuple[str, str], content: str) -> str:
    start, end = text.index(markers[0]), text.index(markers[1]) + len(markers[1])
    return text[:start] + content + text[end:]


def _check(entry: PlanEntry, spec: ModelSpec) -> None:
    check_positions(entry, spec, RUNTIME)
    if spec.is_moe:
        _check_moe(entry, spec)
    elif entry.ep > 1:
        raise ExportError(f"{RUNTIME}: ep {entry.ep} on the dense model {spec.name}; {replan_for(RUNTIME)}")
    check_rules(entry, RUNTIME)
    if entry.dtype not in DTYPES:
        raise ExportError(f"{RUNTIME}: dtype '{entry.dtype}' is not supported here (use one of {DTYPES})")
    if entry.tp > 1:
        shapes = {
            "attention heads": spec.num_attention_heads,
            "KV heads": spec.num_kv_heads,
            "FFN hidden size": spec.ffn_hidden_size,
        }
        for what, size in shapes.items():
            if size % entry.tp:
                raise ExportError(
                    f"{RUNTIME}: {what} ({size}) are not divisible by tp {entry.tp}; {replan_for(RUNTIME)}"
                )
        if spec.position_embedding == "alibi":
            raise ExportError(
                f"{RUNTIME}: ALiBi slopes per head are not sharded by the script's "
                f"tensor parallelism; {replan_for(RUNTIME)}"
            )


def _check_moe(entry: PlanEntry, spec: ModelSpec) -> None:
    """What the script's mixture of experts (planner/torch_blocks.py MoE) does not do."""
    features = [
        what
        for present, what in (
            (spec.is_mla, "latent attention"),
            (spec.mtp_depth > 0, "multi-token prediction"),
            (spec.activation != "swiglu", f"{spec.activation} experts"),
            (spec.moe_capacity_factor is not None, "a capacity factor"),
            (spec.moe_router_num_groups is not None, "group-limited routing"),
            (spec.moe_router_expert_bias, "a routing expert bias"),
        )
        if present
    ]
    if features:
        raise ExportError(
            f"{RUNTIME}: model {spec.name} has {', '.join(features)}, which the exported script's "
            "blocks (planner/torch_blocks.py: GQA, dropless SwiGLU experts, top-k of all experts' "
            "scores) do not have"
        )
    if entry.tp > 1:
        raise ExportError(
            f"{RUNTIME}: tensor parallelism (tp={entry.tp}) of a mixture of experts is not in the "
            f"exported script (experts parallel over data-parallel ranks only); {replan_for(RUNTIME)}"
        )
    if entry.dp % entry.ep or spec.num_experts % entry.ep:
        raise ExportError(
            f"{RUNTIME}: ep {entry.ep} must divide dp ({entry.dp}) and the experts "
            f"({spec.num_experts}): the script's expert parallelism runs over data-parallel "
            f"ranks; {replan_for(RUNTIME)}"
        )
    if entry.ep > 1 and entry.zero_stage == 3:
        raise ExportError(
            f"{RUNTIME}: ZeRO-3 with expert parallelism (ep={entry.ep}): the script's FSDP "
            f"would shard each rank's own experts as if replicated; {replan_for(RUNTIME)}"
        )


def _schedule(entry: PlanEntry) -> tuple[str | None, str | None]:
    """(torch schedule class name or None, per-rank CSV or None) of the planned schedule."""
    if entry.pp == 1:
        return None, None
    from planner.schedule import TORCH_SCHEDULE_CLASS, generate, to_csv

    csv_text = to_csv(generate(entry.schedule, entry.pp, entry.num_microbatches, entry.vpp))
    torch_name = TORCH_SCHEDULE_CLASS[entry.schedule]
    if entry.schedule == "zb_h1" and entry.vpp == 1:
        torch_name = None  # the paper's ZB-H1 (one chunk per rank) is not torch's ZB1P: run the CSV
    return torch_name, csv_text
