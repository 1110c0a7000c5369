"""The HF ``Trainer`` with a DeepSpeed config (ZeRO-2, ``gradient_accumulation_steps=4``) on a
tiny GPT-2 (random weights), launched with ``torchrun`` on 2 CPU ranks, with
``AccumguardCallback`` attached. ``--modes`` runs one Trainer per mode in this process:

``ok``    the Trainer's own loss (normalised by ``num_items_in_batch``): correct.
``mean``  a ``compute_loss`` override returning the per-micro-batch token mean, ignoring
          ``num_items_in_batch`` (uneven token counts: F5).

``--sweep DIR`` records each mode in ``DIR/<mode>`` (``accumguard.runtime.watch.recording``);
without it the script runs as is (under ``accumguard watch``). The callback's findings go to
``<out>/<mode>-callback.json`` (rank 0; ``--out`` defaults to the sweep directory).
"""

import argparse
import contextlib
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
p.add_argument("--sweep", default=None)
p.add_argument("--out", default=None)
p.add_argument("--local_rank", type=int, default=0)
args = p.parse_args()
K = 4
OUT = Path(args.out or args.sweep or tempfile.mkdtemp(prefix="accumguard-hf-ds-"))
WORLD = 2
# (HF's "auto" for train_batch_size counts one process on CPU: given in full)
DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": K,
             "train_batch_size": 2 * K * WORLD, "gradient_clipping": "auto",
             "zero_optimization": {"stage": 2}}


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


def train(mode: str) -> list[dict[str, Any]]:
    # On CPU the Trainer's own state would start DeepSpeed with no backend and count one
    # process: the process group (gloo) is set up first and the Trainer told to use it.
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")
    AcceleratorState._reset_state()  # one Trainer after another in this process (the test)
    model = tiny_gpt2(0)
    model.loss_type = "ForCausalLM"  # the Trainer counts the shifted labels the loss uses
    targs = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="accumguard-hf-ds-"), deepspeed=DS_CONFIG,
        per_device_train_batch_size=2, gradient_accumulation_steps=K,
        num_train_epochs=1, learning_rate=1e-3, max_grad_norm=0.0, report_to="none",
        save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
        accelerator_config={"use_configured_state": True})
    cb = AccumguardCallback(every_n_steps=1)
    cls = MeanLoss if mode == "mean" else Trainer
    trainer = cls(model=model, args=targs, train_dataset=samples(), callbacks=[cb])
    trainer.train()
    return trainer.state.accumguard_findings


for mode in args.modes.split(","):
    ctx: Any = contextlib.nullcontext()
    if args.sweep:
        from accumguard.runtime.watch import recording

        ctx = recording(Path(args.sweep) / mode)
    with ctx:
        findings = train(mode)
    if torch.distributed.get_rank() == 0:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{mode}-callback.json").write_text(json.dumps(findings))
    torch.distributed.barrier()
with contextlib.suppress(Exception):
    torch.distributed.destroy_process_group()
print("done", args.modes)
