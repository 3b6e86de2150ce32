"""What torch.compile fuses in a Llama block (docs/accuracy_published.md section 15): the bytes
every non-matmul, non-attention kernel of inductor's forward and backward code reads and writes
for torchtitan's 2024-12 Llama 3 block (per-op SAC or full AC, compiled on CPU), per token and
per element of the three activation widths, against the memory-bound bytes the cost model
charges a block (`layer_work`'s elementwise bytes: forward, backward and the recomputed
forward). Their ratio is the `elementwise_traffic` the compiled torchtitan rows carry."""

from __future__ import annotations

import math
import re

import pytest

from planner.fidelity.published import cost_options, load_runs

torch = pytest.importorskip("torch")

from tests.cost.llama_block import RUNS, block, bytes_per_element, checkpointed, inputs, traffic_ratio  # noqa: E402  (needs torch)

ITEM_BYTES = {"BFloat16": 2, "bfloat16": 2, "float": 4, "float32": 4, "complex64": 8, "int64_t": 8, "bool": 1}
VIEWS = {"view_as_complex", "view_as_real", "reshape", "_conj"}
COMPILED_ROWS = {  # torchtitan rows run with torch.compile, and their activation checkpointing
    "torchtitan-llama3-8b-fsdp8-compile": "op",
    "torchtitan-llama3-8b-fsdp128-compile": "op",
    "torchtitan-llama3-8b-fsdp8-tp8": "op",
    "torchtitan-llama3-70b-fsdp32-tp8": "full",
}


def _compiled_code(ac: str) -> list[str]:
    """inductor's forward and backward code for one bf16 block under `ac`, compiled as torchtitan
    compiles it (`torch.compile(block, fullgraph=True)` after the checkpoint wrapper)."""
    from torch._inductor.utils import run_and_get_code

    x, freqs_cis = inputs()
    compiled = torch.compile(checkpointed(block().to(torch.bfloat16), ac), fullgraph=True)
    try:
        _, codes = run_and_get_code(lambda: compiled(x, freqs_cis).sum().backward())
    finally:
        torch._dynamo.reset()
    return codes


def _split(args: str) -> list[str]:
    """A call's arguments, split at the top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += (ch in "([") - (ch in ")]")
        cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def _numel(sizes: str) -> int:
    """Elements of a size tuple's text; 0 for a symbolic one (the checkpoint's RNG state)."""
    parts = [p.strip() for p in sizes.split(",") if p.strip()]
    return math.prod(int(p) for p in parts) if all(p.isdigit() for p in parts) else 0


def _kernel_params(code: str) -> dict[str, list[tuple[str, str]]]:
    """Each C++ kernel's parameters: (element type, name), the name saying in_ptr (read),
    out_ptr (written) or in_out_ptr (both)."""
    params = {}
    for name, text in re.findall(
        r'^(cpp_fused\w+) = async_compile\.cpp_pybinding\(.*?extern "C"\s+void\s+kernel\(([^)]*)\)', code, re.M | re.S
    ):
        params[name] = [
            re.match(r"\s*(?:const )?(?:at::)?(\w+)\*\s*(\w+)", p).groups() for p in text.split(",") if p.strip()
        ]
    return params


def _accesses(code: str) -> list[tuple[int, int, int]]:
    """Every buffer access of the non-matmul, non-attention kernels in `call`: the inductor
    kernels (by their parameters) and the aten fallbacks (inputs read, output written; views
    move nothing), as (elements, bytes per element, times accessed)."""
    params = _kernel_params(code)
    alias, size, dtype, out = {}, {}, {}, []

    def root(name):
        return root(alias[name]) if name in alias else name

    for line in code[code.index("def call(self, args):") :].splitlines():
        line = line.split("; del ")[0].split("  #")[0].strip()
        if m := re.match(r"(\w+) = empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)", line):
            size[m[1]], dtype[m[1]] = _numel(m[2]), m[3]
        elif m := re.match(r"assert_size_stride\((\w+), \(([^)]*)\)", line):
            size[root(m[1])] = _numel(m[2])
        elif m := re.match(r"(\w+) = (\w+)$", line):
            alias[m[1]] = m[2]
        elif m := re.match(r"(\w+) = reinterpret_tensor\((\w+), \(([^)]*)\)", line):
            size[m[1]], dtype[m[1]] = _numel(m[3]), dtype.get(root(m[2]))
        elif m := re.match(r"(cpp_fused\w+)\((.*)\)$", line):
            for (ctype, pname), arg in zip(params[m[1]], _split(m[2])):
                view = re.match(r"reinterpret_tensor\((\w+), \(([^)]*)\)", arg)
                name = root(view[1] if view else arg)
                dtype.setdefault(name, ctype)
                out.append(
                    (name, _numel(view[2]) if view else None, ITEM_BYTES[ctype], 2 if pname.startswith("in_out") else 1)
                )
        elif m := re.match(r"(\w+) = torch\.ops\.aten\.(\w+)\.\w+\((.*)\)$", line):
            op, args = m[2], [root(a) for a in _split(m[3]) if re.match(r"\w+$", a)]
            complex_view = {"view_as_complex": "complex64", "view_as_real": "float32"}
            dtype[m[1]] = complex_view.get(op, dtype.get(args[0], "complex64"))
            if op not in VIEWS and not op.startswith("_scaled_dot_product"):
                out += [(name, None, None, 1) for name in args + [m[1]]]
    return [
        (n if n is not None else size.get(name, 0), b or ITEM_BYTES[dtype.get(name) or "float32"], times)
        for name, n, b, times in out
    ]


@pytest.fixture(scope="module", params=["op", "full"])
def counted(request):
    forward, backward = _compiled_code(request.param)
    return request.param, bytes_per_element(_accesses(forward)), bytes_per_element(_accesses(backward))


@pytest.mark.slow
def test_the_compiled_forward_moves_what_section_15_counts(counted):
    """Forward, bytes per element: norms 4 + 6 (the second reads x and wo's output: the first
    residual is not stored, the last kernel adds it again), RoPE 20 per q/k element (bf16 -> fp32
    kernel, aten's complex mul in fp32, fp32 -> bf16 kernel: inductor does not generate code for
    complex tensors), repeat_kv's copies of k and v at width h, SwiGLU 6, last residual 8."""
    _, forward, _ = counted
    assert forward == {"h": 42, "kv": 20, "ffn": 6}


@pytest.mark.slow
def test_compiled_rows_carry_the_counted_traffic(counted):
    """Each compiled torchtitan row's elementwise_traffic is the ratio counted on inductor's code
    for its model and activation checkpointing, to two decimals."""
    ac, forward, backward = counted
    runs = {run.name: run for run in load_runs(RUNS)}
    rows = [name for name, mode in COMPILED_ROWS.items() if mode == ac]
    assert rows
    for name in rows:
        run = runs[name]
        assert cost_options(run).kernels.elementwise_traffic == round(traffic_ratio(run.model, forward, backward), 2), (
            name
        )
