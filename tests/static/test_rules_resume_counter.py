"""AG150 at the boundary: a fairseq-style trainer tests ``(self.micro_step + 1) % K``, steps
through a helper, writes its checkpoint inside that branch and increments the counter only
after it. The checkpoint stores the counter one short; restored as saved, the first resumed
micro-batch closes a window of one. Twins: the counter saved as ``micro_step + 1``, the
increment before the test, a counter the loop does not increment by hand."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source

_TRAINER = """
import torch


class Trainer:
    def __init__(self, model, update_freq):
        self.model, self.update_freq = model, update_freq
        self.optimizer = torch.optim.Adam(model.parameters())
        self.micro_step = 0
        self.num_updates = 0

    def optimizer_step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.num_updates += 1

    def train(self, batches, path):
        for sample in batches:
            self.model(sample).sum().backward()
{loop}

    def save_checkpoint(self, path):
        torch.save({{"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "micro_step": {saved}}}, path)

    def load_checkpoint(self, path):
        st = torch.load(path)
        self.model.load_state_dict(st["model"])
        self.optimizer.load_state_dict(st["optimizer"])
        self.num_updates, self.micro_step = st["num_updates"], st["micro_step"]
"""

_AFTER = """            if (self.micro_step + 1) % self.update_freq == 0:
                self.optimizer_step()
                if self.num_updates % 3 == 0:
                    self.save_checkpoint(path)
            self.micro_step += 1"""

_BEFORE = """            self.micro_step += 1
            if self.micro_step % self.update_freq == 0:
                self.optimizer_step()
                if self.num_updates % 3 == 0:
                    self.save_checkpoint(path)"""


def _ag150(loop: str, saved: str) -> list[str]:
    src = textwrap.dedent(_TRAINER.format(loop=loop, saved=saved))
    return [f.message for f in lint_source(src) if f.code == "AG150"]


def test_counter_saved_before_its_increment() -> None:
    found = _ag150(_AFTER, "self.micro_step")
    assert len(found) == 1, found
    assert "before `self.micro_step += 1`" in found[0]
    assert "window of one micro-batch" in found[0]


@pytest.mark.parametrize(("loop", "saved"), [
    (_AFTER, "self.micro_step + 1"),   # the fix: the counter as it will be
    (_BEFORE, "self.micro_step"),      # incremented before the test and the save
])
def test_counter_saved_at_the_windows_end_is_silent(loop: str, saved: str) -> None:
    assert _ag150(loop, saved) == []
