"""The HF ``Trainer`` with a DeepSpeed config (``gradient_accumulation_steps=K``) on a tiny
GPT-2 (random weights), launched with ``torchrun`` on 2 CPU ranks. ``--modes`` runs one
Trainer per mode in this process; a mode is ``name`` or ``name@stage`` (ZeRO stage,
default ``--stage``, 2):

``ok``     the Trainer's own loss (normalised by ``num_items_in_batch``), with
           ``AccumguardCallback``: correct.
``plain``  the same run with no callback and no recording: its final weights must equal
           ``ok``'s bit for bit (accumguard changes nothing).
``mean``   a ``compute_loss`` override returning the per-micro-batch token mean, ignoring
           ``num_items_in_batch`` (uneven token counts: F5).
``clip0``  ``max_grad_norm=0`` (no clipping asked) and a DeepSpeed config without
           ``gradient_clipping``: DeepSpeed clips at its default 1.0 (F9).
``clipauto`` ``max_grad_norm=1.0`` (the Trainer's default) and no ``gradient_clipping``:
           DeepSpeed's default 1.0 is what the Trainer asked for: no F9.
``gamis``  a DeepSpeed config with ``gradient_accumulation_steps`` 2 while the Trainer's is
           K: the Trainer refuses it (its ValueError text goes to ``<out>/gamis-error.txt``).

``--sweep DIR`` records each mode in ``DIR/<mode>`` (``accumguard.watch._recording.recording``);
without it the script runs as is (under ``accumguard watch`` / ``accumguard invariance``:
``--k {K} --mb {MB}``). The callback's findings go to ``<out>/<mode>-callback.json`` (rank 0;
``--out`` defaults to the sweep directory), each rank's final-weight digest to
``<out>/<mode>-rank<R>.sha``.
"""

import argparse
import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState, PartialState
from transformers import Trainer, TrainingArguments

from accumguard.demo.frameworks import SEQ, VOCAB, tiny_gpt2
from accumguard.integrations.transformers import AccumguardCallback

p = argparse.ArgumentParser()
p.add_argument("--modes", default="ok")
p.add_argument("--stage", type=int, default=2)
p.add_argument("--k", type=int, default=4)
p.add_argument("--mb", type=int, default=2)
p.add_argument("--sweep", default=None)
p.add_argument("--out", default=None)
p.add_argument("--local_rank", type=int, default=0)
args = p.parse_args()
K = args.k
OUT = Path(args.out or args.sweep or tempfile.mkdtemp(prefix="accumguard-hf-ds-"))
WORLD = 2


def ds_config(mode: str, stage: int) -> dict[str, Any]:
    # (HF's "auto" for train_batch_size counts one process on CPU: given in full)
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": args.mb,
                           "gradient_accumulation_steps": 2 if mode == "gamis" else K,
                           "train_batch_size": args.mb * K * WORLD, "gradient_clipping": "auto",
                           "zero_optimization": {"stage": stage}}
    if mode.startswith("clip"):
        del cfg["gradient_clipping"]  # left to DeepSpeed's default
    return cfg


def samples(n: int = 48) -> list[dict[str, torch.Tensor]]:
    """Causal-LM samples with uneven valid lengths (labels -100 after a random cut)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        labels = ids.clone()
        labels[int(torch.randint(2, SEQ + 1, (1,), generator=g)):] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


class MeanLoss(Trainer):
    """The 2024 bug: each micro-batch's token mean, ``num_items_in_batch`` ignored."""

    def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        out = model(input_ids=inputs["input_ids"])
        logits, labels = out.logits[..., :-1, :], inputs["labels"][..., 1:]
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
        return (loss, out) if return_outputs else loss


def digest(model: torch.nn.Module) -> str:
    """This rank's weights (its ZeRO-3 partitions, else the full parameters), hashed."""
    h = hashlib.sha256()
    for _, prm in sorted(model.named_parameters()):
        t = getattr(prm, "ds_tensor", None)
        h.update((t if t is not None else prm).detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(mode: str, stage: int) -> tuple[list[dict[str, Any]], str]:
    # On CPU the Trainer's own state would start DeepSpeed with no backend and count one
    # process: the process group (gloo) is set up first and the Trainer told to use it.
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")
    AcceleratorState._reset_state()  # one Trainer after another in this process (the test)
    model = tiny_gpt2(0)
    model.loss_type = "ForCausalLM"  # the Trainer counts the shifted labels the loss uses
    targs = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="accumguard-hf-ds-"),
        deepspeed=ds_config(mode, stage), per_device_train_batch_size=args.mb,
        gradient_accumulation_steps=K, num_train_epochs=1, learning_rate=1e-3,
        max_grad_norm=1.0 if mode == "clipauto" else 0.0, report_to="none",
        save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
        accelerator_config={"use_configured_state": True})
    cb = [] if mode == "plain" else [AccumguardCallback(every_n_steps=1)]
    cls = MeanLoss if mode == "mean" else Trainer
    trainer = cls(model=model, args=targs, train_dataset=samples(), callbacks=cb)
    trainer.train()
    return getattr(trainer.state, "accumguard_findings", []), digest(trainer.model_wrapped)


for spec in args.modes.split(","):
    mode, _, st = spec.partition("@")
    name = spec.replace("@", "-z")
    ctx: Any = contextlib.nullcontext()
    if args.sweep and mode != "plain":
        from accumguard.watch._recording import recording

        ctx = recording(Path(args.sweep) / name)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        with ctx:
            findings, sha = train(mode, int(st or args.stage))
    except ValueError as err:
        if mode != "gamis":
            raise
        (OUT / f"{name}-error.txt").write_text(str(err))
        continue
    rank = torch.distributed.get_rank()
    (OUT / f"{name}-rank{rank}.sha").write_text(sha)
    if rank == 0:
        (OUT / f"{name}-callback.json").write_text(json.dumps(findings))
    torch.distributed.barrier()
with contextlib.suppress(Exception):
    torch.distributed.destroy_process_group()
print("done", args.modes)
