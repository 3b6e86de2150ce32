"""The torch measurements on CPU: saved activations against the analytic model, I + W
against the full backward (FLOPs), parameters, out-of-memory rows."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.catalog import resolve_model  # noqa: E402
from planner.cost import memory  # noqa: E402
from planner.cost.shapes import Shard  # noqa: E402
from planner.profile.measure import Settings, measure_shape, param_count  # noqa: E402
from planner.profile.schema import ShapeKey  # noqa: E402

ACTIVATION_CASES = [
    (model, kind, tp, recompute)
    for model in ("tiny-llama", "tiny-gpt")
    for kind, recomputes in (("embedding", ("none",)), ("transformer", ("none", "full")), ("head", ("none",)))
    for tp in (1, 2)
    for recompute in recomputes
]


@pytest.mark.parametrize(("model", "kind", "tp", "recompute"), ACTIVATION_CASES)
def test_saved_activations_match_the_analytic_model(one_thread, model, kind, tp, recompute):
    spec = resolve_model(model)
    row = measure_shape(
        spec, ShapeKey(kind, tp, 2, 64, recompute), Settings(device="cpu", dtype="bf16", warmup=0, repeats=1)
    )
    assert row.status == "ok", row.message
    expected = memory.activation_bytes(spec, kind, Shard(mbs=2, seq=64, tp=tp), recompute)
    assert row.activation_bytes == pytest.approx(expected, rel=0.10)


@pytest.mark.parametrize(
    ("model", "kind"),
    [("tiny-llama", "transformer"), ("tiny-gpt", "transformer"), ("tiny-llama", "head"), ("tiny-gpt", "head")],
)
def test_input_plus_weight_backward_computes_the_full_backward(one_thread, model, kind):
    # Counted, not timed (timings move with the machine's load; tests/bench/ compares them):
    # the split's I and W run exactly the matrix multiplies of the one-call backward, and
    # W's are the weight gradients, as many FLOPs as the forward's products with weights.
    row = measure_shape(
        resolve_model(model),
        ShapeKey(kind, 1, 2, 64, "none"),
        Settings(device="cpu", dtype="fp32", warmup=0, repeats=1),
    )
    assert row.status == "ok", row.message
    assert min(row.forward_ms, row.backward_input_ms, row.backward_weight_ms, row.backward_ms) > 0
    assert row.backward_input_flops + row.backward_weight_flops == row.backward_flops
    assert row.backward_weight_flops == row.forward_flops > 0


def test_embedding_runs_its_whole_backward_as_weight_step(one_thread):
    row = measure_shape(
        resolve_model("tiny-llama"),
        ShapeKey("embedding", 1, 1, 64, "none"),
        Settings(device="cpu", dtype="fp32", warmup=0, repeats=2),
    )
    assert row.backward_input_ms == 0.0 and row.backward_weight_ms > 0


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt", "llama3-70b", "gpt3-175b"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_parameters_match_the_analytic_counts(model, tp):
    spec = resolve_model(model)
    assert param_count(spec, "transformer", tp) == memory.transformer_param_count(spec, tp)
    # a vocabulary shard has whole rows (ceil(vocab / tp)); the analytic count divides exactly
    one_row = spec.hidden_size
    assert param_count(spec, "embedding", tp) == pytest.approx(memory.embedding_param_count(spec, tp), abs=one_row)
    assert param_count(spec, "head", tp) == pytest.approx(memory.head_param_count(spec, tp), abs=one_row)


def test_out_of_memory_is_a_row_and_the_next_shape_runs(one_thread):
    spec = resolve_model("tiny-llama")
    capped = Settings(device="cpu", dtype="fp32", warmup=0, repeats=1, memory_cap_bytes=8 * 2**20)
    big = measure_shape(spec, ShapeKey("transformer", 1, 8, 256, "none"), capped)
    assert big.status == "oom" and "memory cap" in big.message
    assert big.forward_ms is None and big.param_count == memory.transformer_param_count(spec)
    small = measure_shape(spec, ShapeKey("transformer", 1, 1, 32, "none"), capped)
    assert small.status == "ok"


def test_failures_are_error_rows(monkeypatch):
    import planner.profile.measure as measure

    def broken(*args):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        except torch.OutOfMemoryError as exc:  # as torch.distributed.pipelining wraps it
            raise RuntimeError("Failed to run stage backward input") from exc

    monkeypatch.setattr(measure, "_measure", broken)
    row = measure_shape(resolve_model("tiny-llama"), ShapeKey("head", 1, 1, 8, "none"), Settings(device="cpu"))
    assert (row.status, row.message) == ("oom", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    monkeypatch.setattr(measure, "_measure", lambda *a: (_ for _ in ()).throw(RuntimeError("bad shape\nmore")))
    row = measure_shape(resolve_model("tiny-llama"), ShapeKey("head", 1, 1, 8, "none"), Settings(device="cpu"))
    assert (row.status, row.message) == ("error", "RuntimeError: bad shape")


def test_memory_lean_block_functions_have_exact_gradients():
    from planner.torch_blocks import _RMSNormFunction, _SwiGLUFunction

    double = dict(dtype=torch.float64, requires_grad=True)
    x, weight = torch.randn(2, 3, 8, **double), torch.randn(8, **double)
    assert torch.autograd.gradcheck(lambda a, w: _RMSNormFunction.apply(a, w, 1e-5), (x, weight))
    gate, up = torch.randn(2, 3, 8, **double), torch.randn(2, 3, 8, **double)
    assert torch.autograd.gradcheck(_SwiGLUFunction.apply, (gate, up))
    plain = torch.nn.functional.rms_norm(x, (8,), weight, 1e-5)
    assert torch.allclose(_RMSNormFunction.apply(x, weight, 1e-5), plain)
