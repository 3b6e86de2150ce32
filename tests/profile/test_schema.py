"""The profile file format: required fields, unique keys, the shape list."""

from __future__ import annotations

import pytest
from profile_factories import make_profile, ok_row
from pydantic import ValidationError

from planner.profile.schema import LayerRow, Profile, ShapeKey, shape_keys


def test_round_trip_through_json():
    profile = make_profile([ok_row(), ok_row(kind="head", mbs=2)])
    again = Profile.model_validate_json(profile.model_dump_json())
    assert again == profile
    assert again.row_map()[ShapeKey("head", 1, 2, 1024, "none")].mbs == 2


def test_ok_row_needs_its_timings():
    with pytest.raises(ValidationError, match="forward_ms"):
        LayerRow(kind="transformer", tp=1, mbs=1, seq=8, status="ok", param_count=1)


def test_failed_row_needs_only_its_reason():
    row = LayerRow(kind="head", tp=2, mbs=4, seq=8, status="oom", message="too big", param_count=5)
    assert row.key == ShapeKey("head", 2, 4, 8, "none")
    assert row.forward_ms is None


def test_recompute_full_only_for_blocks():
    with pytest.raises(ValidationError, match="transformer kind only"):
        ok_row(kind="head", recompute="full")


def test_unknown_fields_and_kinds_are_refused():
    with pytest.raises(ValidationError, match="extra"):
        ok_row(speed=3)
    with pytest.raises(ValidationError, match="kind"):
        ok_row(kind="mlp")


def test_duplicate_keys_are_refused():
    with pytest.raises(ValidationError, match="two rows for transformer tp=1 mbs=1 seq=1024"):
        make_profile([ok_row(), ok_row(forward_ms=2.0)])


def test_with_row_replaces_the_same_key():
    profile = make_profile([ok_row()]).with_row(ok_row(forward_ms=5.0))
    assert [r.forward_ms for r in profile.rows] == [5.0]


def test_shape_keys_order_and_recompute_only_where_it_differs():
    keys = shape_keys(["embedding", "transformer", "head"], [1, 2], [1], [64], ["none", "full"])
    assert keys[:4] == [
        ShapeKey("embedding", 1, 1, 64, "none"),
        ShapeKey("transformer", 1, 1, 64, "none"),
        ShapeKey("transformer", 1, 1, 64, "full"),
        ShapeKey("head", 1, 1, 64, "none"),
    ]
    assert len(keys) == 8
    assert shape_keys(["head"], [1], [1, 2], [64], ["full"]) == []
