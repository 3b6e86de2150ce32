"""Profile lookup: exact at measured shapes, monotone between them, bounded extrapolation,
refusal of profiles measured for another model or device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from profile_factories import make_profile, ok_row

from planner.catalog import resolve_gpu, resolve_model
from planner.cost.compute import AnalyticCompute
from planner.cost.memory import activation_bytes
from planner.cost.model import CostModel, CostOptions, compute_slowdown
from planner.cost.shapes import Shard, layer_work
from planner.errors import ConfigError, PlannerError
from planner.profile import store
from planner.profile.lookup import EXTRAPOLATION_FACTOR, ProfiledCompute, profiled_source
from planner.spec import Cluster

SPEC = resolve_model("llama3-8b")
H100 = resolve_gpu("h100")
MBS, SEQS = (1, 4, 16), (1024, 4096)


def _analytic_row(kind, tp, mbs, seq):
    """A row whose numbers come from the analytic model (smooth, monotone, realistic)."""
    shard = Shard(mbs=mbs, seq=seq, tp=tp)
    t = AnalyticCompute(H100).layer_times(layer_work(SPEC, kind, shard))
    return ok_row(
        kind=kind,
        tp=tp,
        mbs=mbs,
        seq=seq,
        forward_ms=t.forward_s * 1e3,
        backward_input_ms=t.backward_input_s * 1e3,
        backward_weight_ms=t.backward_weight_s * 1e3,
        activation_bytes=round(activation_bytes(SPEC, kind, shard, "none")),
    )


ROWS = [
    _analytic_row(kind, tp, mbs, seq)
    for kind in ("transformer", "head")
    for tp in (1, 2)
    for mbs in MBS
    for seq in SEQS
]
OOM = ok_row(kind="transformer", tp=1, mbs=64, seq=4096).model_copy(
    update={"status": "oom", "message": "CUDA out of memory"}
)
PROFILE = make_profile([*ROWS, OOM], model="llama3-8b", device="NVIDIA H100 80GB HBM3", device_type="cuda")
SOURCE = ProfiledCompute(PROFILE, "profile:h100.json")


def _forward(mbs, seq, kind="transformer", tp=1, cp=1):
    return SOURCE.layer_times(kind, Shard(mbs=mbs, seq=seq, tp=tp, cp=cp)).forward_s


def test_exact_at_every_measured_shape():
    for row in ROWS:
        times = SOURCE.layer_times(row.kind, Shard(mbs=row.mbs, seq=row.seq, tp=row.tp))
        assert times.forward_s == row.forward_ms / 1e3
        assert times.backward_input_s == row.backward_input_ms / 1e3
        assert times.backward_weight_s == row.backward_weight_ms / 1e3
        assert SOURCE.activation_bytes(row.kind, Shard(mbs=row.mbs, seq=row.seq, tp=row.tp)) == row.activation_bytes


@settings(max_examples=60, deadline=None)
@given(mbs=st.integers(1, 15), seq=st.integers(1024, 4096 - 64), tp=st.sampled_from([1, 2]))
def test_monotone_between_measured_shapes(mbs, seq, tp):
    here = _forward(mbs, seq, tp=tp)
    assert _forward(mbs + 1, seq, tp=tp) >= here
    assert _forward(mbs, seq + 64, tp=tp) >= here
    low = min(_forward(m, s, tp=tp) for m in MBS for s in SEQS)
    high = max(_forward(m, s, tp=tp) for m in MBS for s in SEQS)
    assert low <= here <= high


def test_between_lengths_lies_between_the_lengths():
    assert _forward(4, 1024) < _forward(4, 2048) < _forward(4, 4096)


def test_context_parallel_uses_local_tokens_at_the_full_length():
    # mbs 4, seq 4096, cp 4: 4096 local tokens attending 4096 keys, i.e. the mbs 1 row.
    assert _forward(4, 4096, cp=4) == _forward(1, 4096)


def test_extrapolation_within_the_factor():
    last = _forward(16, 1024)
    assert last < _forward(32, 1024) <= last * 2  # slope at most 1 in tokens
    assert _forward(1, 8192) >= _forward(1, 4096)


def test_extrapolation_beyond_the_factor_is_one_line_naming_shape_and_range():
    mbs = int(16 * EXTRAPOLATION_FACTOR) * 2
    with pytest.raises(PlannerError) as info:
        _forward(mbs, 4096)
    text = str(info.value)
    assert "\n" not in text
    assert f"transformer at tp=1 mbs={mbs} seq=4096" in text
    assert "measured tokens at seq 4096 4096..65536" in text
    assert "out of memory when profiled at tokens 262144" in text
    with pytest.raises(PlannerError, match="measured seq 1024..4096"):
        _forward(1, 16384)


def test_unmeasured_tp_or_kind():
    with pytest.raises(PlannerError, match=r"no transformer measurements at tp=4 \(measured tp: 1, 2\)"):
        _forward(1, 1024, tp=4)
    with pytest.raises(PlannerError, match="no embedding measurements"):
        _forward(1, 1024, kind="embedding")


def test_activation_bytes_where_measured_only():
    assert SOURCE.activation_bytes("transformer", Shard(mbs=1, seq=1024, tp=2, sequence_parallel=True)) is None
    assert SOURCE.activation_bytes("transformer", Shard(mbs=1, seq=1024), "selective") is None
    assert SOURCE.activation_bytes("transformer", Shard(mbs=1, seq=1024, tp=8)) is None
    head = Shard(mbs=4, seq=1024)
    assert SOURCE.activation_bytes("head", head, "full") == SOURCE.activation_bytes("head", head)
    assert SOURCE.activation_bytes("transformer", Shard(mbs=2, seq=1024)) == pytest.approx(
        activation_bytes(SPEC, "transformer", Shard(mbs=2, seq=1024), "none")
    )


def test_profiled_source_feeds_the_cost_model(tmp_path):
    path = tmp_path / "h100-llama3-8b.json"
    store.save(path, PROFILE)
    source = profiled_source(path, SPEC, H100)
    assert source.name == "profile:h100-llama3-8b.json"
    measured = ROWS[[r.key for r in ROWS].index(("transformer", 2, 4, 1024, "none"))].forward_ms / 1e3
    shard = Shard(mbs=4, seq=1024, tp=2)
    model = CostModel(SPEC, Cluster.of(H100, 8), CostOptions.of(stragglers=False), source=source)
    assert model.layer_costs("transformer", shard).forward_s == measured
    # timed on one GPU; the 8-GPU job waits for its slowest GPU (planner/cost/stragglers.py)
    model = CostModel(SPEC, Cluster.of(H100, 8), source=source)
    slowest = compute_slowdown(H100, CostOptions(), 8)
    assert slowest > 1.0 and model.layer_costs("transformer", shard).forward_s == pytest.approx(measured * slowest)


def test_profile_of_another_model_is_refused(tmp_path):
    path = tmp_path / "p.json"
    store.save(path, PROFILE)
    with pytest.raises(PlannerError) as info:
        profiled_source(path, resolve_model("tiny-llama"), H100)
    text = str(info.value)
    assert "measured for model 'llama3-8b', not for 'tiny-llama'" in text
    assert "hidden_size 4096 != 256" in text and "\n" not in text


def test_same_shape_under_another_name_is_accepted(tmp_path):
    path = tmp_path / "p.json"
    store.save(path, PROFILE)
    renamed = SPEC.model_copy(update={"name": "my-llama", "source": "config.json"})
    assert profiled_source(path, renamed, H100).layer_times("head", Shard(mbs=1, seq=1024))


def test_profile_of_another_gpu_is_refused(tmp_path):
    path = tmp_path / "a100.json"
    store.save(path, PROFILE.model_copy(update={"device": "NVIDIA A100-SXM4-80GB"}))
    with pytest.raises(PlannerError, match="measured on 'NVIDIA A100-SXM4-80GB', not on h100"):
        profiled_source(path, SPEC, H100)
    assert profiled_source(path, SPEC, resolve_gpu("a100-80gb"))


def test_profile_without_measurements_is_refused(tmp_path):
    path = tmp_path / "empty.json"
    store.save(path, make_profile([OOM], model="llama3-8b"))
    with pytest.raises(ConfigError, match="no successful layer measurements"):
        profiled_source(path, SPEC, H100)
