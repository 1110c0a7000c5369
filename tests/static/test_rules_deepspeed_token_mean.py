"""AG104 under DeepSpeed's engine loop: engine.backward divides the loss by the config's
gradient_accumulation_steps, so a per-micro-batch token mean handed to it is a mean of means
(blind round 32, writer b); told ``scale_wrt_gas=False`` the engine divides nothing, and a
loss over the window's count is no per-micro-batch mean."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source

_SRC = """
import deepspeed
import torch.nn.functional as F

def token_ce(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

def train(model, windows, c):
    cfg = {{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": c.accum,
           "gradient_clipping": 0.0}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for window in windows:
        for ids, labels in window:
            loss = token_ce(engine(ids), labels)
            engine.backward(loss{kw})
            engine.step()
"""


def _codes(src: str) -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src))]


def test_a_token_mean_handed_to_engine_backward_is_a_mean_of_means() -> None:
    assert _codes(_SRC.format(kw="")) == ["AG104"]


def test_scale_wrt_gas_false_divides_nothing() -> None:
    assert "AG104" not in _codes(_SRC.format(kw=", scale_wrt_gas=False"))
