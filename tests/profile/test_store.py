"""Profile files: atomic writes, and one-line ConfigErrors naming the failing field."""

from __future__ import annotations

import json
import os

import pytest
from profile_factories import make_profile, ok_row

from planner.errors import ConfigError, PlannerError
from planner.profile import store


def test_save_then_load(tmp_path):
    path = tmp_path / "sub" / "p.json"
    profile = make_profile([ok_row()])
    store.save(path, profile)
    assert store.load(path) == profile
    assert [p.name for p in path.parent.iterdir()] == ["p.json"]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as any new file is


def test_a_failed_write_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    first = make_profile([ok_row()])
    store.save(path, first)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(PlannerError, match="cannot write profile .*p.json: disk full"):
        store.save(path, first.with_row(ok_row(mbs=2)))
    monkeypatch.undo()
    assert store.load(path) == first
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.pop("schema_version"), "schema_version"),
        (lambda d: d.update(schema_version=7), "schema_version"),
        (lambda d: d["rows"][0].pop("forward_ms"), "rows.0"),
        (lambda d: d["rows"][0].update(tp=0), "rows.0.tp"),
        (lambda d: d["model"].update(hidden_size="big"), "model.hidden_size"),
    ],
)
def test_schema_failures_name_the_field(tmp_path, edit, field):
    data = json.loads(make_profile([ok_row()]).model_dump_json())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        store.load(path)
    message = str(info.value)
    assert f"field '{field}" in message and "bad.json" in message and "\n" not in message


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read profile"):
        store.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        store.load(tmp_path / "x.json")
