"""The three layout types (search Candidate, hot-path Layout, plan-file PlanEntry) share one
field definition, and the converters between them lose nothing."""

from __future__ import annotations

from dataclasses import fields

from planner.catalog import resolve_model
from planner.layout import SHARED_FIELDS, Layout, entry_from_layout, even_stage_layers, layout_from_entry
from planner.plan import PlanEntry
from planner.search.costing import layout_of
from planner.search.space import Candidate


def test_each_type_holds_every_shared_field():
    for names in ({f.name for f in fields(Candidate)}, {f.name for f in fields(Layout)}, set(PlanEntry.model_fields)):
        assert set(SHARED_FIELDS) <= names


def test_candidate_layout_entry_round_trip():
    spec = resolve_model("tiny-llama")
    candidate = Candidate(
        tp=2,
        pp=2,
        dp=2,
        cp=1,
        vpp=2,
        mbs=1,
        num_microbatches=4,
        schedule="interleaved_1f1b",
        sequence_parallel=True,
        zero_stage=1,
        modes=("none", "full"),
        ep=1,
        etp=None,
    )
    cuts = even_stage_layers(spec.num_layers, 2, 2, "interleaved_1f1b")
    layout = layout_of(candidate, cuts, ("none", "full"))
    assert all(getattr(layout, name) == getattr(candidate, name) for name in SHARED_FIELDS)
    entry = entry_from_layout(layout, global_batch=8, seq=512, predicted=None)
    assert (entry.global_batch, entry.seq, entry.recompute) == (8, 512, ["none", "full"])
    assert layout_from_entry(entry) == layout
