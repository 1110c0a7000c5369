"""accumguard.engines.base.any_nonfinite: the non-finite flag every replicated-gradient engine
uses at the boundary (NaN, +Inf, -Inf in any tensor, any float dtype; huge finite values are
not flagged)."""

from __future__ import annotations

import pytest
import torch

from accumguard.engines.base import any_nonfinite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_flags_a_single_bad_element_in_any_tensor(dtype: torch.dtype, bad: float) -> None:
    tensors = [torch.randn(7, 3).to(dtype), torch.randn(11).to(dtype), torch.randn(0).to(dtype)]
    assert not bool(any_nonfinite(tensors))
    tensors[1][4] = bad  # the second tensor only: the flag must look at every tensor
    assert bool(any_nonfinite(tensors))


def test_large_finite_values_and_edge_cases() -> None:
    big = torch.full((1000,), torch.finfo(torch.float32).max)  # a sum or 2-norm would overflow
    assert not bool(any_nonfinite([big, -big]))
    assert not bool(any_nonfinite([]))
    assert not bool(any_nonfinite([torch.zeros(0)]))
    flag = any_nonfinite([torch.ones(3)])
    assert flag.dtype == torch.bool and flag.dim() == 0
