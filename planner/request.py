"""The request a plan answers: model, cluster, runtime@version and the cost options set over it.

One `Request` is built by every command (`plan`, `evaluate`, `sweep`, `cost`, `report`), by the
Python API and by the published-runs harness; `planner.job.build` turns it into the model, the
cluster and the cost model. A plan file keeps it, so `report` rebuilds the same job.
"""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

FLAG_OPTIONS = {
    "attention": "--attention",
    "precision": "--precision",
    "moe_imbalance": "--moe-imbalance",
    "moe_dispatcher": "--moe-dispatcher",
    "speed_spread": "--gpu-speed-spread",
}
"""Cost options with a flag of their own taking a value; the rest are written `--set NAME=VALUE`."""
SWITCH_OPTIONS = {
    "moe_ep_overlap": "--moe-ep-overlap",
    "cuda_graphs": "--cuda-graphs",
    "interference": "--interference",
    "stragglers": "--stragglers",
}
"""Boolean cost options with an on/off flag of their own (`--x` / `--no-x`)."""


class Request(BaseModel):
    """What a user asks the planner about: the job, and how its runtime runs it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    """A preset name (`planner models`) or a config.json path."""
    gpu: str = "h100"
    num_gpus: int = Field(gt=0)
    global_batch: int = Field(default=1, gt=0)
    seq: int = Field(default=1, gt=0)
    gpus_per_node: int | None = Field(default=None, gt=0)
    intra_node_bw_gbps: float | None = Field(default=None, gt=0)
    inter_node_bw_gbps: float | None = Field(default=None, gt=0)
    max_memory_gb: float | None = Field(default=None, gt=0)
    memory_headroom: float | None = Field(default=None, ge=0, le=0.5)
    """Share of the memory plans keep free; None: the default (`planner.uncertainty`)."""
    runtime: str | None = None
    """NAME[@VERSION] (`planner runtimes`); None: planner's defaults (Megatron-LM's kernels)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Cost options (CostOptions field names) set over the runtime version's."""
    profile: str | None = None
    profile_only: bool = False
    calibration: str | None = None

    @field_validator("options")
    @classmethod
    def _lists_as_tuples(cls, options: dict[str, Any]) -> dict[str, Any]:
        """A list read from JSON is the tuple the cost option holds."""
        return {name: tuple(value) if isinstance(value, list) else value for name, value in options.items()}

    def cluster_flags(self) -> list[str]:
        """The command-line flags that state this request's model, cluster and batch."""
        flags = [
            "--model",
            self.model,
            "--gpus",
            str(self.num_gpus),
            "--gpu",
            self.gpu,
            "--global-batch",
            str(self.global_batch),
            "--seq",
            str(self.seq),
        ]
        for flag, value in (
            ("--gpus-per-node", self.gpus_per_node),
            ("--intra-node-bw", self.intra_node_bw_gbps),
            ("--inter-node-bw", self.inter_node_bw_gbps),
            ("--max-memory-gb", self.max_memory_gb),
            ("--memory-headroom", self.memory_headroom),
            ("--runtime", self.runtime),
            ("--profile", self.profile),
            ("--calibration", self.calibration),
        ):
            if value is not None:
                flags += [flag, _number_text(value)]
        return flags + (["--profile-only"] if self.profile_only else [])

    def option_flags(self) -> list[str]:
        """The command-line flags that set this request's cost options."""
        return [word for name, value in self.options.items() for word in option_flag(name, value)]


def option_flag(name: str, value: Any) -> list[str]:
    """The command-line words that set cost option `name` to `value`."""
    if name in FLAG_OPTIONS:
        return [FLAG_OPTIONS[name], _number_text(value)]
    if name in SWITCH_OPTIONS:
        return [SWITCH_OPTIONS[name] if value else "--no-" + SWITCH_OPTIONS[name][2:]]
    return ["--set", f"{name}={option_text(value)}"]


def command_text(words: list[str]) -> str:
    """A command line as a shell would take it."""
    return " ".join(shlex.quote(word) for word in words)


def _number_text(value: Any) -> str:
    """A flag's value as typed: 450 for 450.0."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def option_text(value: Any) -> str:
    """A cost option's value as `--set` takes it: true/false, a comma list, a number or a word."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return _number_text(value)
