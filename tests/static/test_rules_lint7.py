"""Lint gaps closed on branch lint7, by class: a HF model call given ``num_items_in_batch``
(the window's count is a normalisation, this micro-batch's own is a mean again), a loss
divided by a global batch that holds the world size under DDP/FSDP, masked token means
built in a trainer's method or by a collate function of the file, an Accelerate-prepared
scheduler's horizon in micro-batches, a DeepSpeed config built by a dataclass method, and a
GradScaler switched on by a dataclass field's default."""

from __future__ import annotations

from pathlib import Path

import pytest

from accumguard.static import Severity
from accumguard.static.lint import lint_file, lint_source

CORPUS = Path(__file__).resolve().parents[1] / "lint_corpus"

FLAGGED = {
    # AG122 still holds when num_items_in_batch is this micro-batch's own count
    "bug_hf_num_items_own_micro_count.py": ("AG122", Severity.ERROR),
    # AG112 through a name for micro_bsz * K * world_size (module and trainer class)
    "bug_ddp_sum_loss_over_global_batch_world.py": ("AG112", Severity.ERROR),
    "bug_fsdp_trainer_sum_over_global_bsz.py": ("AG112", Severity.ERROR),
    # AG104 (a warning, as every F5 mean of means): a trainer method's masked token mean,
    # a HF .loss whose labels a collate function masks with -100
    "bug_pg_trainer_class_masked_mean_method.py": ("AG104", Severity.WARNING),
    "bug_pg_masked_token_mean_helper_div_k.py": ("AG104", Severity.WARNING),
    "bug_hf_collate_masks_padding_loss_div_k.py": ("AG104", Severity.WARNING),
    "bug_hf_causal_lm_labels_masked_fill_div_k.py": ("AG104", Severity.WARNING),
    "bug_hf_labels_ignore_pad_trainer_inner_loop.py": ("AG104", Severity.WARNING),
    # AG124 under Accelerate accumulation: a LambdaLR through a helper's parameter, a class
    "bug_accelerate_horizon_micro_batches_lambda_helper.py": ("AG124", Severity.ERROR),
    "bug_accelerate_horizon_cosine_trainer_class.py": ("AG124", Severity.ERROR),
    # AG203 on a config returned by a dataclass method
    "bug_ds_config_dataclass_method_no_clipping.py": ("AG203", Severity.WARNING),
    # AG135: a dataclass field defaulting to True that nothing sets decides the scaler
    "bug_amp_clip_before_unscale_cfg_field.py": ("AG135", Severity.ERROR),
    "bug_amp_clip_before_unscale_cfg_field_cli.py": ("AG135", Severity.WARNING),
}

SILENT = [
    "ok_hf_num_items_window_count_loop.py",
    "ok_hf_num_items_trainer_class_inline.py",
    "ok_ddp_sum_loss_over_local_window_batch.py",
    "ok_manual_allreduce_sum_global_batch_world.py",
    "ok_pg_masked_token_sum_window_count.py",
    "ok_hf_causal_lm_fixed_length_div_k.py",
    "ok_accelerate_horizon_optimizer_steps_lambda_helper.py",
    "ok_accelerate_horizon_cosine_trainer_class_div_k.py",
    "ok_ds_config_dataclass_method_clipping_set.py",
    "ok_amp_unscale_then_clip_cfg_field.py",
]


@pytest.mark.parametrize("name", sorted(FLAGGED))
def test_flagged_with_its_severity(name: str) -> None:
    code, severity = FLAGGED[name]
    found = [f for f in lint_file(CORPUS / name) if f.code == code]
    assert found, name
    assert all(f.severity is severity for f in found), [(f.code, f.severity) for f in found]


@pytest.mark.parametrize("name", SILENT)
def test_twin_is_silent(name: str) -> None:
    """No error or warning (a note on the config's cost, AG205, is not a claim of a bug)."""
    assert [(f.code, f.line) for f in lint_file(CORPUS / name) if f.severity is not Severity.NOTE] == []


_NUM_ITEMS = '''
import torch
grad_accum = 4
for step in range(steps):
    window = [next(it) for _ in range(grad_accum)]
    n = sum((b["labels"] != -100).sum() for b in window)
    for micro in range(grad_accum):
        batch = window[micro]
{body}
    opt.step()
    opt.zero_grad()
'''


@pytest.mark.parametrize(("body", "flagged"), [
    ("        model(**batch).loss.backward()", True),                                  # a mean
    ("        model(**batch, num_items_in_batch=n).loss.backward()", False),           # window
    ("        out = model(**batch, num_items_in_batch=n)\n        out.loss.backward()", False),
    ("        loss = loss_fn(model(**batch).logits, batch['labels'], num_items_in_batch=n)\n"
     "        loss.backward()", False),                                              # a loss function
    ("        c = (batch['labels'] != -100).sum()\n"
     "        model(**batch, num_items_in_batch=c).loss.backward()", True),            # its own count
    ("        model(**batch, num_items_in_batch=(batch['labels'] != -100).sum()).loss.backward()", True),
])
def test_num_items_in_batch_is_a_normalisation(body: str, flagged: bool) -> None:
    found = [f for f in lint_source(_NUM_ITEMS.format(body=body)) if f.code == "AG122"]
    assert bool(found) is flagged


def test_num_items_window_count_divided_by_k_is_not_a_mean_of_means() -> None:
    src = _NUM_ITEMS.format(body="        (model(**batch, num_items_in_batch=n).loss / grad_accum).backward()")
    assert [f.code for f in lint_source(src) if f.code == "AG104"] == []


_SCALER = '''
from dataclasses import dataclass
import torch

@dataclass
class Cfg:
    accum: int = 4
    amp: bool = {default}

def train(cfg: Cfg):
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.amp)
    for i, (x, y) in enumerate(loader):
        scaler.scale(loss_fn(model(x), y) / cfg.accum).backward()
        if (i + 1) % cfg.accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
{tail}
'''


@pytest.mark.parametrize(("default", "tail", "severity"), [
    ("True", "train(Cfg())", Severity.ERROR),
    ("True", "train(Cfg(amp=args.amp))", Severity.WARNING),          # the keyword may switch it off
    ("True", "train(Cfg(**vars(args)))", Severity.WARNING),
    ("True", "train(HfArgumentParser(Cfg).parse_args_into_dataclasses()[0])", Severity.WARNING),
    ("True", "cfg = Cfg()\ncfg.amp = args.amp\ntrain(cfg)", Severity.WARNING),
    ("False", "train(Cfg())", None),                                   # off: scale() is the identity
    # a string's replace() sets no field; dataclasses.replace(cfg, **kw) may
    ("True", "out = 'run.pt'\ninit = out.replace('.pt', '.init.pt')\ntrain(Cfg())", Severity.ERROR),
    ("True", "import dataclasses\ntrain(dataclasses.replace(Cfg(), **overrides))",
     Severity.WARNING),
])
def test_scaler_enabled_by_a_dataclass_default(default: str, tail: str, severity: Severity | None) -> None:
    found = [f for f in lint_source(_SCALER.format(default=default, tail=tail)) if f.code == "AG135"]
    assert [f.severity for f in found] == ([severity] if severity else [])


_DDP = '''
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(net)
grad_accum = 4
{define}
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / global_batch
    loss.backward()
    if (i + 1) % grad_accum == 0:
        opt.step()
        opt.zero_grad()
'''


@pytest.mark.parametrize(("define", "flagged"), [
    ("global_batch = micro_bsz * grad_accum * world_size", True),
    ("global_batch = micro_bsz * grad_accum * dist.get_world_size()", True),
    ("global_batch = micro_bsz * grad_accum", False),
    ("global_batch = micro_bsz * grad_accum * dist.get_world_size() // dist.get_world_size()", False),
])
def test_global_batch_with_the_world_size_under_ddp(define: str, flagged: bool) -> None:
    found = [f for f in lint_source(_DDP.format(define=define)) if f.code == "AG112"]
    assert bool(found) is flagged


@pytest.mark.parametrize(("count", "flagged"), [
    ("n.item()", False),                       # the window's count, made a Python number
    ("int(n)", False),
    ("self_total", False),
    ("int((batch['labels'] != -100).sum())", True),
])
def test_num_items_count_read_from_the_window_or_the_micro_batch(count: str, flagged: bool) -> None:
    body = f"        model(**batch, num_items_in_batch={count}).loss.backward()"
    src = _NUM_ITEMS.format(body=body).replace("    n = sum(", "    self_total = n = sum(")
    found = [f for f in lint_source(src) if f.code == "AG122"]
    assert bool(found) is flagged
