"""planner/profile/counts.py: grouped-query attention's FLOPs under torch releases whose
attention formulas assert equal query and key/value head counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.profile.counts import _formula_flops  # noqa: E402


def _strict_sdpa_flops(query, key, value, out_val=None) -> int:
    """An attention formula that, as torch 2.11's does, refuses unequal head counts:
    QK^T and PV, 2 FLOPs per multiply-add each."""
    assert query.shape[1] == key.shape[1] == value.shape[1], "shapes are incompatible"
    batch, heads, seq_q, dim = query.shape
    return 2 * 2 * batch * heads * seq_q * key.shape[2] * dim


def test_grouped_query_attention_counts_every_query_head():
    query = torch.empty(2, 8, 16, 4, device="meta")
    key = value = torch.empty(2, 2, 16, 4, device="meta")
    expected = 4 * 2 * 8 * 16 * 16 * 4  # closed form: 4 b h_q s_q s_k d
    assert _formula_flops(_strict_sdpa_flops, (query, key, value), {}, None) == expected
    full = torch.empty(2, 8, 16, 4, device="meta")
    assert _formula_flops(_strict_sdpa_flops, (query, full, full), {}, None) == expected


def test_other_failures_still_raise():
    query = torch.empty(2, 8, 16, 4, device="meta")
    key = torch.empty(2, 3, 16, 4, device="meta")  # 3 does not divide 8: not a GQA layout
    with pytest.raises(AssertionError):
        _formula_flops(_strict_sdpa_flops, (query, key, key), {}, None)
