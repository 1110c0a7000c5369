"""pytest plugin, registered through the ``pytest11`` entry point: installing accumguard
makes these fixtures available in every test session.

Fixtures:

* ``dist_run``: ``dist_run(fn, *args, world_size=2, timeout=120)`` runs the
  module-level function ``fn(rank, world_size, *args)`` on real gloo ranks
  (:func:`accumguard.runtime.launch.run_on_ranks`) and returns the per-rank results.
* ``accumulation_guard``: ``accumulation_guard(model, optimizer, accumulation_steps=K, ...)``
  installs an :class:`~accumguard.runtime.guard.AccumulationGuard` for the rest of the test
  (same arguments as :func:`accumguard.runtime.guard.guard`). Any violation fails the test:
  at once (raised where it happens), and again at teardown if the loop swallowed it.
* ``assert_accumulation_equivalent``: the helper of :mod:`accumguard.verify.testing`, as a
  fixture for tests that prefer injection to imports.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest

if TYPE_CHECKING:
    import torch

    from accumguard.runtime.guard import AccumulationGuard

R = TypeVar("R")

__all__ = ["DistRun", "accumulation_guard", "assert_accumulation_equivalent", "dist_run"]


class DistRun(Protocol):
    """What the ``dist_run`` fixture gives: ``fn``'s return value on every rank."""

    def __call__(self, fn: Callable[..., R], *args: object, world_size: int = 2,
                 timeout: float = 120.0) -> list[R]: ...


@pytest.fixture
def dist_run() -> DistRun:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks."""
    from accumguard.runtime.launch import run_on_ranks

    def run(fn: Callable[..., R], *args: object, world_size: int = 2,
            timeout: float = 120.0) -> list[R]:
        return run_on_ranks(fn, world_size, args, timeout=timeout)

    return run


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test body failed, so the guard fixture does not report a
    violation twice (once raised in the test, once at teardown)."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def accumulation_guard(request: pytest.FixtureRequest
                       ) -> Iterator[Callable[..., AccumulationGuard]]:
    """Factory: install a guard for the rest of the test; violations fail the test."""
    from accumguard.runtime.guard import guard

    guards: list[AccumulationGuard] = []

    def install(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **kwargs: Any
                ) -> AccumulationGuard:
        kwargs.setdefault("mode", "raise")
        g = guard(model, optimizer, **kwargs).install()
        guards.append(g)
        return g

    yield install
    already_failed = request.node.stash.get(_CALL_FAILED, False)
    problems: list[str] = []
    for g in reversed(guards):
        try:
            g.close(check=not g.violations)
        except Exception as e:  # noqa: BLE001 - reported below as a test failure
            problems.append(str(e))
        problems += [v.message for v in g.violations if v.message not in problems]
    if problems and not already_failed:
        pytest.fail("accumulation guard violations:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(name="assert_accumulation_equivalent")
def _assert_accumulation_equivalent_fixture() -> Callable[..., Any]:
    from accumguard.verify.testing import assert_accumulation_equivalent

    return assert_accumulation_equivalent


def assert_accumulation_equivalent(*args: Any, **kwargs: Any) -> Any:
    """See :func:`accumguard.verify.testing.assert_accumulation_equivalent` (imported lazily)."""
    from accumguard.verify.testing import assert_accumulation_equivalent as impl

    return impl(*args, **kwargs)
