"""Property tests of the Boundary state machine: random K and random call sequences
(micro-steps with and without a short window size, invalid sizes, flushes) against a
ten-line model of what must happen. 2,000+ examples per run."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accumguard import Boundary, ConfigError

# ("micro", None) | ("micro", size) | ("flush", None)
OPS = st.one_of(
    st.tuples(st.just("micro"), st.none()),
    st.tuples(st.just("micro"), st.integers(min_value=-1, max_value=20)),
    st.tuples(st.just("flush"), st.none()),
)


@settings(max_examples=2500, deadline=None)
@given(k=st.integers(min_value=1, max_value=12), ops=st.lists(OPS, max_size=60))
def test_boundary_fires_exactly_when_the_model_says(k: int, ops: list) -> None:
    calls: list[str] = []
    b = Boundary(k, reducer=lambda: calls.append("reduce"), stepper=lambda: calls.append("step"))
    count = closed = micro = 0
    for op, size in ops:
        before = len(calls)
        if op == "flush":
            fired = b.flush()
            assert fired == (count > 0)
            if fired:
                count, closed = 0, closed + 1
        else:
            limit = k if size is None else size
            if not 1 <= limit <= k:
                try:
                    b.micro_step(window_size=size)
                except ConfigError as err:
                    assert "window_size" in str(err)
                else:  # pragma: no cover - the property fails here
                    raise AssertionError(f"window_size={size} accepted with K={k}")
                assert (b.count, b.micro_steps) == (count, micro)  # state untouched
                continue
            assert b.is_last(size) == (count + 1 >= limit)
            fired = b.micro_step(window_size=size)
            count, micro = count + 1, micro + 1
            assert fired == (count >= limit)
            if fired:
                count, closed = 0, closed + 1
        # Reduce then step, once each, exactly when a window closed; never anything else.
        assert calls[before:] == (["reduce", "step"] if fired else [])
        assert (b.count, b.windows_closed, b.micro_steps) == (count, closed, micro)
        assert 0 <= b.count < k
    assert calls == ["reduce", "step"] * closed
