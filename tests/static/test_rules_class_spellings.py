"""Statically decidable bug classes in several spellings each, against their correct twins:
zero_grad in a closure or a clearing helper run per micro-batch (AG102), a loss term not
divided by a K read from the boundary (AG127), DeepSpeed bf16 accumulation on ZeRO-1/2
(AG204, its severity from K and the stage), a trainer's per-micro-batch method (AG122,
AG127), an HF ``compute_loss`` normalised by ``num_items_in_batch`` and divided by K
(AG136), per-micro-batch token counts from lengths or labels (AG104)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from accumguard.core.precision import f12_error_k
from accumguard.static.dsconfig import check_config
from accumguard.static.lint import lint_file, lint_source


def found(src: str) -> list[tuple[str, int, str]]:
    return [(f.code or "", f.line or 0, f.severity.value) for f in lint_source(textwrap.dedent(src))]


def codes(src: str) -> list[str]:
    return [c for c, _, _ in found(src)]


# ---------------------------------------------------------------- 1. zero_grad per micro-batch

_CLOSURE = """
import torch
K = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i, (x, y) in enumerate(loader):
    def closure():
        {clear}
        loss = model(x).mean() / K
        loss.backward()
        return loss
    closure()
    if (i + 1) % K == 0:
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("clear", ["opt.zero_grad()", "model.zero_grad(set_to_none=True)"])
def test_closure_clearing_per_micro_batch_is_f3(clear: str) -> None:
    assert found(_CLOSURE.format(clear=clear)) == [("AG102", 7, "error")]


def test_closure_without_clear_is_silent() -> None:
    assert found(_CLOSURE.format(clear="pass")) == []


_RUNNER = """
import torch

class Runner:
    def __init__(self, model, loader, accum_steps):
        self.model, self.loader, self.accum_steps = model, loader, accum_steps
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def _reset(self):
        self.opt.zero_grad(set_to_none=True)

    def _forward_backward(self, batch):
        {in_helper}
        loss = self.model(batch).mean() / self.accum_steps
        loss.backward()

    def train(self):
        {before}
        for it, batch in enumerate(self.loader):
            {in_loop}
            self._forward_backward(batch)
            if (it + 1) % self.accum_steps == 0:
                self.opt.step()
                {at_boundary}
"""


@pytest.mark.parametrize(("where", "expected"), [
    ({"in_helper": "self._reset()"}, [("AG102", 10, "error")]),   # from the backward helper
    ({"in_loop": "self._reset()"}, [("AG102", 10, "error")]),     # from the window itself
    ({"before": "self._reset()", "at_boundary": "self._reset()"}, []),
    ({"in_loop": "if it % self.accum_steps == 0:\n                self._reset()",
      "at_boundary": "pass"}, []),
])
def test_clearing_helper_is_followed_from_the_window_and_its_helpers(
        where: dict[str, str], expected: list[tuple[str, int, str]]) -> None:
    parts = {"in_helper": "pass", "before": "pass", "in_loop": "pass", "at_boundary": "pass", **where}
    assert found(_RUNNER.format(**parts)) == expected


def test_grads_cleared_by_hand_in_a_closure() -> None:
    clear = "for p in model.parameters():\n            p.grad = None"
    assert found(_CLOSURE.format(clear=clear)) == [("AG102", 8, "error")]
    # the closure moves each micro-batch's .grad into its own buffer first: accumulation by hand
    moved = ("for p, b in zip(model.parameters(), bufs):\n"
             "            b += p.grad\n            p.grad = None")
    assert found(_CLOSURE.format(clear=moved)) == []


def test_clearing_helper_in_a_k1_loop_is_silent() -> None:
    assert found("""
        import torch
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def clear():
            opt.zero_grad()
        for batch in loader:
            clear()
            model(batch).mean().backward()
            opt.step()
    """) == []


# ---------------------------------------------------------------- 2. a term not divided by K

_TERMS = """
import torch
{k} = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i, (x, y) in enumerate(loader):
    out, aux = model(x)
    ce = out.loss
{body}
    if (i + 1) % {k} == 0:
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("body", [
    "    loss = ce / K + z_coef * aux\n    loss.backward()",
    "    loss = ce / K + aux\n    loss.backward()",
    "    (ce / K + 1e-5 * aux).backward()",
    "    loss = ce / K\n    loss += z_coef * aux\n    loss.backward()",
    "    c = ce / K\n    loss = c + 0.01 * aux\n    loss.backward()",
])
def test_term_beside_one_divided_by_the_boundary_k_is_found(body: str) -> None:
    out = found(_TERMS.format(k="K", body=body))
    assert [c for c, _, s in out if s == "error"] == ["AG127"], out
    assert all(line > 1 for _, line, _ in out)  # a term from a tuple unpacking has its place


@pytest.mark.parametrize("body", [
    "    loss = (ce + z_coef * aux) / K\n    loss.backward()",
    "    loss = ce + aux\n    (loss / K).backward()",
    "    loss = ce / K + aux / K\n    loss.backward()",
    "    loss = ce / K + (0.1 / K) * aux\n    loss.backward()",
    "    loss = ce / K + 0.1 * aux / K\n    loss.backward()",
    "    zc = 0.1 / K\n    loss = ce / K + zc * aux\n    loss.backward()",
    "    loss = ce + 0.1 * aux\n    loss /= K\n    loss.backward()",
])
def test_terms_each_divided_by_k_are_silent(body: str) -> None:
    assert found(_TERMS.format(k="K", body=body)) == []


def test_a_coefficient_assigned_once_over_k_carries_the_division() -> None:
    src = _TERMS.format(k="K", body="    loss = ce / K + z_scaled * aux\n    loss.backward()")
    assert found(src.replace("K = 4\n", "K = 4\nz_scaled = z_coef / K\n")) == []
    assert codes(src.replace("K = 4\n", "K = 4\nz_scaled = z_coef * 2\n")) == ["AG127"]


def test_the_k_of_a_range_window_that_steps_after_it() -> None:
    src = """
        import torch
        for step in range(100):
            for micro in range(n):
                out, aux = model(next(it))
                loss = out.loss / n + 0.01 * aux
                loss.backward()
            opt.step()
            opt.zero_grad()
    """
    assert codes(src) == ["AG127"]
    assert codes(src.replace("out.loss / n + 0.01 * aux", "(out.loss + 0.01 * aux) / n")) == []


def test_a_division_by_another_name_is_not_k() -> None:
    # `/ temperature` is not the boundary's K: nothing is divided by K, nothing to compare
    assert found(_TERMS.format(k="K", body="    loss = ce / temperature + aux\n    loss.backward()")) == []


# ---------------------------------------------------------------- 3. DeepSpeed bf16 accumulation

def _ds(ga: int, stage: int | None, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ga,
                              "gradient_clipping": 0.0, "bf16": {"enabled": True}, **extra}
    if stage is not None:
        cfg["zero_optimization"] = {"stage": stage, "overlap_comm": True}
    return cfg


def _ag204(cfg: dict[str, object]) -> list[str]:
    return [f.severity.value for f in check_config(cfg) if f.code == "AG204"]  # type: ignore[arg-type]


def test_bf16_zero12_error_from_the_shared_f12_bound() -> None:
    k = f12_error_k()
    assert k == 4
    for stage in (1, 2):
        assert _ag204(_ds(k, stage)) == ["error"]
        assert _ag204(_ds(k - 1, stage)) == ["warning"]
        assert _ag204(_ds(512, stage, data_types={"grad_accum_dtype": "bf16"})) == ["error"]
        assert _ag204(_ds(512, stage, data_types={"grad_accum_dtype": "fp32"})) == []
    for stage in (None, 0, 3):  # not the ZeRO-1/2 optimizer's own sum: a warning
        assert _ag204(_ds(512, stage)) == ["warning"]
    auto = _ds(512, 2)
    auto["bf16"] = {"enabled": "auto"}
    assert _ag204(auto) == []  # the HF Trainer decides: not counted


_DS_SCRIPT = """
import deepspeed
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                       config="ds.json")
for batch in loader:
    engine.backward(engine(batch))
    engine.step()
"""


def test_a_named_config_file_gets_ag204_at_the_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(_ds(256, 2)), encoding="utf-8")
    script = tmp_path / "train.py"
    script.write_text(_DS_SCRIPT, encoding="utf-8")
    assert [(f.code, f.line, f.severity.value) for f in lint_file(script)] == [("AG204", 4, "error")]
    (tmp_path / "ds.json").write_text(json.dumps(_ds(3, 2)), encoding="utf-8")
    assert [(f.code, f.severity.value) for f in lint_file(script)] == [("AG204", "warning")]
    (tmp_path / "ds.json").write_text(json.dumps(_ds(256, 2, data_types={"grad_accum_dtype": "fp32"})),
                                      encoding="utf-8")
    assert lint_file(script) == []


_DS_DICT = """
import argparse
import deepspeed
GA = 256
p = argparse.ArgumentParser()
p.add_argument("--grad_accum", type=int, default=256)
args = p.parse_args()
cfg = {{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": {ga},
       "gradient_clipping": 0.0, "bf16": {{"enabled": True}}, "zero_optimization": {{"stage": 2}}}}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
for batch in loader:
    engine.backward(engine(batch))
    engine.step()
"""


def test_a_dict_config_whose_ga_is_a_name_is_judged_with_its_value() -> None:
    def ag204(ga: str) -> list[str]:
        return [s for c, _, s in found(_DS_DICT.format(ga=ga)) if c == "AG204"]
    assert ag204("GA") == ["error"]             # one integer in the file
    # the argparse default is what the script runs as written (the evidence says a command
    # line may change it), as AG120 and AG117 read it
    assert ag204("args.grad_accum") == ["error"]
    assert ag204("int(os.environ['GA'])") == []   # not in sight


def test_a_config_file_read_by_a_script_without_deepspeed_is_not_judged(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(_ds(256, 2)), encoding="utf-8")
    script = tmp_path / "ref.py"
    script.write_text('import json\ncfg = json.load(open("ds.json"))\nga = cfg["gradient_accumulation_steps"]\n',
                      encoding="utf-8")
    assert lint_file(script) == []


# ---------------------------------------------------------------- 4. a trainer's per-micro-batch method

_TRAINER = """
import torch

class MyTrainer:
    def __init__(self, model, loader, grad_accum=8):
        self.model, self.loader, self.K = model, loader, grad_accum
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train(self):
        for i, b in enumerate(self.loader):
            self.{name}(b, i)

    def {name}(self, b, i):
        out = self.model(**b)
{loss}
        loss.backward()
        if (i + 1) % self.K == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
"""


@pytest.mark.parametrize("name", ["training_step", "micro_step", "_run_batch"])
def test_trainer_method_follows_k_and_the_loop(name: str) -> None:
    right = _TRAINER.format(name=name, loss="        loss = out.loss / self.K")
    assert found(right) == []
    mean = _TRAINER.format(name=name, loss="        loss = out.loss")
    assert [(c, s) for c, _, s in found(mean)] == [("AG122", "error")]
    aux = _TRAINER.format(name=name, loss="        loss = out.loss / self.K + 0.01 * out.aux_loss")
    assert [(c, s) for c, _, s in found(aux)] == [("AG127", "error")]
    whole = _TRAINER.format(name=name, loss="        loss = (out.loss + 0.01 * out.aux_loss) / self.K")
    assert found(whole) == []


_HF = """
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
{body}
        return loss

args = TrainingArguments("out", gradient_accumulation_steps=8)
"""


@pytest.mark.parametrize("body", [
    "        loss = model(**inputs, num_items_in_batch=num_items_in_batch).loss\n"
    "        loss = loss / self.args.gradient_accumulation_steps",
    "        out = model(**inputs, num_items_in_batch=num_items_in_batch)\n"
    "        loss = out.loss / self.args.gradient_accumulation_steps",
    "        s = F.cross_entropy(model(**inputs).logits, inputs['labels'], reduction='sum')\n"
    "        loss = s / num_items_in_batch / self.args.gradient_accumulation_steps",
    "        s = F.cross_entropy(model(**inputs).logits, inputs['labels'], reduction='sum')\n"
    "        loss = s / num_items_in_batch\n"
    "        loss /= self.args.gradient_accumulation_steps",
])
def test_hf_window_normalised_loss_divided_by_k_is_g_over_k(body: str) -> None:
    assert [(c, s) for c, _, s in found(_HF.format(body=body))] == [("AG136", "error")]


@pytest.mark.parametrize("body", [
    "        loss = model(**inputs, num_items_in_batch=num_items_in_batch).loss",
    "        s = F.cross_entropy(model(**inputs).logits, inputs['labels'], reduction='sum')\n"
    "        loss = s / num_items_in_batch",
])
def test_hf_window_normalised_loss_alone_is_silent(body: str) -> None:
    assert found(_HF.format(body=body)) == []


def test_hf_division_by_k_in_the_other_branch_is_not_applied_to_the_normalised_loss() -> None:
    body = ("        s = F.cross_entropy(model(**inputs).logits, inputs['labels'], reduction='sum')\n"
            "        loss = s / inputs['labels'].numel()\n"
            "        if num_items_in_batch is not None:\n"
            "            loss = s / num_items_in_batch\n"
            "            return loss\n"
            "        loss /= self.args.gradient_accumulation_steps")
    assert "AG136" not in codes(_HF.format(body=body))


def test_hf_mean_divided_by_k_is_only_the_mean_of_means() -> None:
    body = "        loss = model(**inputs).loss / self.args.gradient_accumulation_steps"
    out = lint_source(textwrap.dedent(_HF.format(body=body)))
    assert [(f.code, f.severity.value) for f in out] == [("AG118", "warning")]
    assert "K times too large" not in out[0].evidence
    undivided = lint_source(textwrap.dedent(_HF.format(body="        loss = model(**inputs).loss")))
    assert [(f.code, f.severity.value) for f in undivided] == [("AG118", "error")]


# ---------------------------------------------------------------- 5. token counts per micro-batch

_PG = """
import torch
accum_steps = 4
opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
for step, batch in enumerate(loader):
{body}
    (loss / accum_steps).backward()
    if (step + 1) % accum_steps == 0:
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize("body", [
    "    logp, mask, lengths = policy(batch)\n    loss = -(logp * mask).sum() / lengths.sum()",
    "    logp, mask = policy(batch)\n    loss = -(logp * mask).sum() / batch['seq_lens'].sum()",
    "    logp, mask = policy(batch)\n    n = batch['lengths'].sum()\n    loss = -(logp * mask).sum() / n",
    "    logp = policy(batch['input_ids'])\n"
    "    loss = -(logp * batch['attention_mask']).sum() / batch['attention_mask'].sum()",
    "    labels = batch['labels']\n    tok = F.cross_entropy(model(batch), labels, reduction='sum')\n"
    "    loss = tok / (labels != -100).sum()",
    "    labels = batch['labels']\n    n_tok = (labels != -100).sum()\n"
    "    tok = F.cross_entropy(model(batch), labels, reduction='sum')\n    loss = tok / n_tok",
])
def test_micro_batch_token_count_spellings_are_mean_of_means(body: str) -> None:
    assert [(c, s) for c, _, s in found(_PG.format(body=body))] == [("AG104", "warning")]


def test_window_token_count_from_lengths_is_silent() -> None:
    assert found("""
        accum_steps = 4
        for step in range(num_steps):
            window = [next(batches) for _ in range(accum_steps)]
            n_tok = sum(int(b["lengths"].sum()) for b in window)
            for b in window:
                logp, mask, lengths = policy(b)
                tok = -(logp * mask).sum()
                loss = tok / n_tok
                loss.backward()
            opt.step()
            opt.zero_grad()
    """) == []


_PG_NO_K = _PG.replace("(loss / accum_steps).backward()", "loss.backward()")


@pytest.mark.parametrize("body", [
    "    logp, mask, lengths = policy(batch)\n    loss = -(logp * mask).sum() / lengths.sum()",
    "    labels = batch['labels']\n    tok = F.cross_entropy(model(batch), labels, reduction='sum')\n"
    "    loss = tok / (labels != -100).sum()",
    "    logp = policy(batch['input_ids'])\n    am = batch['attention_mask']\n"
    "    loss = -(logp * am).sum() / am.sum()",
    "    labels = batch['labels']\n    n_tok = (labels != -100).sum()\n"
    "    tok = F.cross_entropy(model(batch), labels, reduction='sum')\n    loss = tok / n_tok",
])
def test_token_mean_never_divided_by_k_in_count_spellings(body: str) -> None:
    assert [(c, s) for c, _, s in found(_PG_NO_K.format(body=body))] == [("AG129", "error")]


def test_token_sum_over_a_count_made_before_the_window_is_silent() -> None:
    body = "    logp, mask, lengths = policy(batch)\n    loss = -(logp * mask).sum() / n_window_tok"
    assert found(_PG_NO_K.format(body=body)) == []
    body = "    logp, mask, lengths = policy(batch)\n    loss = -(logp * mask).sum() / n_seen"
    assert found(_PG_NO_K.format(body=body)) == []  # a name not counted in the window: no guess


@pytest.mark.parametrize("k", ["K", "accum_steps"])
def test_a_boundary_k_of_one_scales_nothing(k: str) -> None:
    aux = _TERMS.format(k=k, body=f"    loss = ce / {k} + 0.1 * aux\n    loss.backward()")
    assert codes(aux) == ["AG127"]
    assert found(aux.replace(f"{k} = 4", f"{k} = 1")) == []
    mean = _TERMS.format(k=k, body="    loss = ce\n    loss.backward()")
    assert codes(mean) == ["AG122"]
    assert found(mean.replace(f"{k} = 4", f"{k} = 1")) == []
