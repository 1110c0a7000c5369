"""A hook-based trainer: the base class's loop calls ``self.on_after_backward()`` (a no-op
there) on every micro-step, and a subclass in the file overrides it with a clip (blind round
51, c_b03). The rules follow ``self.hook()`` into the overrides of the class's subclasses:
AG105. The twin clips in the hook the loop calls at the boundary."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_SRC = """
import torch


class HookTrainer:
    def on_after_backward(self):
        pass

    def on_before_optimizer_step(self):
        pass

    def fit(self, batches, K):
        for i, b in enumerate(batches):
            (self.model(b).mean() / K).backward()
            self.on_after_backward()
            if (i + 1) % K == 0:
                self.on_before_optimizer_step()
                self.opt.step()
                self.opt.zero_grad()


class ClippedTrainer(HookTrainer):
    def {hook}(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
"""


@pytest.mark.parametrize(("hook", "expected"), [
    ("on_after_backward", ["AG105"]),
    ("on_before_optimizer_step", []),
])
def test_a_subclass_hook_runs_where_the_base_loop_calls_it(hook: str, expected: list[str]) -> None:
    found = [f.code for f in lint_source(textwrap.dedent(_SRC.format(hook=hook)))
             if f.code == "AG105"]
    assert found == expected
