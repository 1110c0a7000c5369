"""The framework-free boundary state machine: the seed report's three CI tests, and more."""

from __future__ import annotations

import pytest

from accumguard import Boundary, ConfigError


class Counter:
    def __init__(self) -> None:
        self.reduces = 0
        self.steps = 0
        self.steps_at: list[int] = []
        self.micro = 0

    def reduce(self) -> None:
        self.reduces += 1

    def step(self) -> None:
        self.steps += 1
        self.steps_at.append(self.micro)


def run(k: int, micro_batches: int) -> tuple[Counter, Boundary]:
    c = Counter()
    b = Boundary(k, reducer=c.reduce, stepper=c.step)
    for _ in range(micro_batches):
        c.micro += 1
        b.micro_step()
    return c, b


def test_one_reduce_and_one_step_per_k_micro_steps() -> None:
    c, _ = run(4, 8)
    assert (c.reduces, c.steps) == (2, 2)


def test_no_step_before_the_kth_micro_step() -> None:
    c, _ = run(4, 4)
    assert c.steps == 1
    assert c.steps_at == [4]


def test_counter_resets_after_each_window() -> None:
    c, b = run(2, 6)
    assert c.steps == 3
    assert c.steps_at == [2, 4, 6]
    assert b.count == 0 and b.windows_closed == 3 and b.micro_steps == 6


def test_partial_window_fires_only_on_flush() -> None:
    c, b = run(4, 6)
    assert c.steps_at == [4]
    assert b.flush() is True
    assert c.steps == 2 and b.count == 0
    assert b.flush() is False  # nothing left: no extra step


def test_known_short_window_closes_at_its_last_micro_step() -> None:
    c = Counter()
    b = Boundary(4, stepper=c.step)
    assert b.is_last(window_size=2) is False
    assert b.micro_step(window_size=2) is False
    assert b.is_last(window_size=2) is True
    assert b.micro_step(window_size=2) is True
    assert c.steps == 1 and b.count == 0


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, None])
def test_bad_accumulation_steps_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="accumulation_steps.*positive int"):
        Boundary(bad)  # type: ignore[arg-type]


def test_window_size_larger_than_k_is_rejected() -> None:
    with pytest.raises(ConfigError, match="between 1 and accumulation_steps"):
        Boundary(2).micro_step(window_size=3)
