"""`runtimes` of every plan (the `runs on` column): exactly the runtimes whose exporter takes
the plan. Checked over every plan of a few small requests that between them mix schedules,
recompute, TP, a GPT-style model (learned positions, biases) and mixtures of experts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import ExportError
from planner.export import EXPORTERS, export_plan
from planner.plan import parse_plan_file

REQUESTS = [
    ("--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--seq", "4096", "--top", "10"),
    ("--model", "tiny-llama", "--gpus", "8", "--global-batch", "32", "--seq", "256", "--top", "10"),
    (
        "--model",
        "tiny-gpt",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--seq",
        "128",
        "--top",
        "10",
        "--schedules",
        "1f1b,interleaved_1f1b,gpipe",
    ),
    (
        "--model",
        "tiny-llama",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq",
        "256",
        "--top",
        "6",
        "--runtime",
        "deepspeed",
    ),
    (
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "32",
        "--global-batch",
        "32",
        "--seq",
        "4096",
        "--top",
        "3",
        "--schedules",
        "1f1b,zbv",
    ),
    (
        "--model",
        "tiny-moe",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq",
        "256",
        "--top",
        "6",
        "--schedules",
        "1f1b,zbv",
    ),
    # zbv now wins both MoE requests above: Megatron-LM's MoE plans, asked for
    (
        "--model",
        "tiny-moe",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq",
        "256",
        "--top",
        "3",
        "--runtime",
        "megatron",
    ),
]


def _exports(document, runtime: str, index: int) -> bool:
    try:
        files = export_plan(document, runtime, index)
    except ExportError:
        return False
    assert files
    return True


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """(request, plan file) for each request, written by `planner plan -o`."""
    from planner.cli import run

    folder = tmp_path_factory.mktemp("plans")
    documents = []
    for number, request in enumerate(REQUESTS):
        path = folder / f"plan{number}.json"
        with pytest.raises(SystemExit) as exit_info:
            run(["plan", *request, "--json", "-o", str(path)])
            raise SystemExit(0)
        assert exit_info.value.code == 0
        documents.append((request, parse_plan_file(path.read_text())))
    return documents


def test_a_plan_exports_to_exactly_the_runtimes_it_names(planned, capsys):
    named_somewhere, refused_somewhere = set(), set()
    for request, document in planned:
        assert document.plans, request
        for index, entry in enumerate(document.plans):
            assert entry.runtimes is not None
            assert entry.runtimes == [name for name in EXPORTERS if name in entry.runtimes]  # known, ordered
            for runtime in EXPORTERS:
                assert _exports(document, runtime, index) == (runtime in entry.runtimes), (request, index, runtime)
            named_somewhere |= set(entry.runtimes)
            refused_somewhere |= set(EXPORTERS) - set(entry.runtimes)
    # the requests exercise both answers for every runtime
    assert named_somewhere == set(EXPORTERS) and refused_somewhere == set(EXPORTERS)


def test_runtime_requests_name_their_runtime_on_every_plan(planned):
    for request, document in planned:
        if "--runtime" in request:
            runtime = request[request.index("--runtime") + 1]
            assert all(runtime in entry.runtimes for entry in document.plans)


def test_mixtures_of_experts_run_on_megatron_torchtitan_and_torch_never_deepspeed(planned):
    moe = [d for r, d in planned if "mixtral-8x7b" in r or "tiny-moe" in r]
    runtimes = [entry.runtimes for document in moe for entry in document.plans]
    assert all("deepspeed" not in names for names in runtimes)
    assert {"megatron", "torchtitan", "torch"} <= {name for names in runtimes for name in names}
    [mixtral] = [d for r, d in planned if "mixtral-8x7b" in r]
    for entry in mixtral.plans:  # tensor parallel: not the torch script's expert parallelism
        assert entry.tp == 1 or "torch" not in entry.runtimes


def test_plan_files_without_runtimes_still_export(planned, tmp_path, capsys):
    """Plan files written before the field existed: read, exported, and `runtimes` is None."""
    from planner.cli import run

    _, document = planned[0]
    raw = json.loads(document.model_dump_json())
    for plan in raw["plans"]:
        del plan["runtimes"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    old = parse_plan_file(path.read_text())
    assert all(entry.runtimes is None for entry in old.plans)
    runtime = document.plans[0].runtimes[0]
    with pytest.raises(SystemExit) as exit_info:
        run(["export", str(path), "--to", runtime, "-o", str(tmp_path / "out")])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    assert any(Path(tmp_path / "out").iterdir())
