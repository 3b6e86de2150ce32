"""`planner runtimes`: every runtime version, what it sets and where it exports; `--options`
lists every cost option `--set` takes."""

from __future__ import annotations

import json

from planner.cost.options import FIELD_GROUP
from planner.runtimes import RUNTIMES


def test_every_version_is_listed_with_what_it_sets(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli("runtimes")
    assert code == 0, err
    for versions in RUNTIMES.values():
        for version in versions:
            assert f"{version.name}  (" in out
    assert "p2p_mode=megatron-lm" in out and "export: --to megatron" in out
    assert all(len(line) <= 80 for line in out.splitlines())
    code, out, err = cli("runtimes", "--json")
    rows = json.loads(out)["runtimes"]
    assert len(rows) == sum(len(v) for v in RUNTIMES.values())
    assert [r["newest"] for r in rows if r["runtime"] == "megatron"] == [True, False, False]


def test_options_lists_every_cost_option(cli):
    code, out, err = cli("runtimes", "--options", "--json")
    assert code == 0, err
    assert {o["name"] for o in json.loads(out)["options"]} == set(FIELD_GROUP)
