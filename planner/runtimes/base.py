"""A training runtime at one version: what it runs, how it runs it, and what it writes.

A `RuntimeVersion` is data. Its `costs` are the cost options (`CostOptions` field names) that
say how this version runs a plan; its `rules` restrict the search space to the layouts it
runs, each with the reason it refuses the rest; `attention` is the attention kernel it runs
by default; `exporter` names the exporter (`planner export --to`) that writes its launch
files, on the latest version only. One module per runtime (planner/runtimes/<name>.py)
holds its versions, the newest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.spec import GpuSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One search-space dimension a runtime fixes: the values it runs and why it runs no other."""

    dimension: str
    """A `SearchSpace` field: schedules, tp, pp, cp, recompute, zero or per_rank_recompute."""
    allowed: tuple[Any, ...]
    why: str
    """Why the runtime runs nothing else."""
    pipelined_only: bool = False
    """The rule binds plans with a pipeline (pp > 1) only; the search applies it to all."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeVersion:
    """One version of a training runtime."""

    runtime: str
    """The runtime's name, as `--runtime` takes it."""
    version: str
    summary: str
    """What this version is and what it changes against the one after it, in one line."""
    costs: dict[str, Any] = field(default_factory=dict)
    """Cost options (CostOptions field names) this version runs a plan with."""
    rules: tuple[Rule, ...] = ()
    attention: str = "flash2"
    """The attention kernel it runs by default."""
    prefers_cudnn: bool = False
    """Transformer Engine's choice: cuDNN fused attention on a GPU with measured cuDNN rates."""
    unsupported: dict[tuple[str, Any], str] = field(default_factory=dict)
    """(cost option, value) pairs this version does not run, and why: a plan priced with one is
    refused, never exported as if the runtime ran it."""
    exporter: str | None = None
    """The `planner export --to` target that writes this version's launch files."""
    sources: tuple[str, ...] = ()
    """Where the facts come from: files and releases of the runtime, papers."""

    @property
    def name(self) -> str:
        """NAME@VERSION."""
        return f"{self.runtime}@{self.version}"

    def default_attention(self, gpu: GpuSpec | None) -> str:
        """The attention kernel this version runs on `gpu`."""
        if self.prefers_cudnn and gpu is not None and gpu.efficiency.cudnn_fwd is not None:
            return "cudnn"
        return self.attention

    def allowed(self, dimension: str) -> tuple[Any, ...] | None:
        """The values of `dimension` this version runs (None: any)."""
        return next((rule.allowed for rule in self.rules if rule.dimension == dimension), None)

    def unsupported_reason(self, option: str, value: Any) -> str | None:
        """Why this version does not run cost option `option` at `value`, or None."""
        return self.unsupported.get((option, value))

    def rule_refusal(self, dimension: str, value: Any, pipelined: bool = True) -> str | None:
        """Why this version does not run `value` of `dimension` (in a plan with a pipeline, or
        without one), or None when it does."""
        for rule in self.rules:
            if rule.dimension == dimension and value not in rule.allowed and (pipelined or not rule.pipelined_only):
                return rule.why
        return None
