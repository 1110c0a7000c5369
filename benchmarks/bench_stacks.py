"""What the framework callbacks cost on the real stacks, side by side.

For each stack (HF ``Trainer``, TRL ``SFTTrainer``, Lightning, an Accelerate loop with
``accumulate()``) the same short training run is made with and without accumguard's callback,
alternating which goes first, in one process (one thread). Each run builds its model from the
same seed and trains ``--steps`` optimizer steps with K = 4; the time of the training call
alone (process CPU time: what a shared machine measures least badly) is compared. Reported per
stack: the median ratio with the callback over without, its interquartile range over the
repetitions, and the median seconds per optimizer step without the callback.

The callbacks check one optimizer step in 10 by default; on these tiny models (tens of
thousands of parameters) a framework's own per-step work is small too, so the ratio here is
an upper bound of what a real model pays.

    python benchmarks/bench_stacks.py [--stacks trainer,trl,lightning,accelerate]
                                      [--steps 20] [--reps 7]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from accumguard.demo._fw_models import VOCAB, hf_samples, tiny_llama

K = 4
MICRO = 4


def _rows(n: int) -> list[dict[str, torch.Tensor]]:
    return hf_samples(n, seed=3)


def _collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}


def _trainer_args(out: str, steps: int, **extra: Any) -> dict[str, Any]:
    return dict(output_dir=out, per_device_train_batch_size=MICRO,
                gradient_accumulation_steps=K, max_steps=steps, learning_rate=1e-3,
                logging_steps=10_000, save_strategy="no", report_to=[], use_cpu=True,
                disable_tqdm=True, dataloader_num_workers=0, seed=0, **extra)


def run_trainer(steps: int, callback: bool) -> float:
    from transformers import Trainer, TrainingArguments

    from accumguard.integrations.transformers import AccumguardCallback

    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=tiny_llama(0), args=TrainingArguments(**_trainer_args(out, steps)),
                          train_dataset=_rows(steps * K * MICRO), data_collator=_collate,
                          callbacks=[AccumguardCallback()] if callback else None)
        t0 = time.process_time()
        trainer.train()
        return time.process_time() - t0


def run_trl(steps: int, callback: bool) -> float:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from accumguard.integrations.transformers import AccumguardCallback

    g = torch.Generator().manual_seed(5)
    rows = [{"input_ids": torch.randint(3, VOCAB, (int(torch.randint(3, 13, (1,), generator=g)),),
                                        generator=g).tolist()} for _ in range(steps * K * MICRO)]
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(**_trainer_args(out, steps), dataset_text_field=None)
        trainer = SFTTrainer(model=tiny_llama(0), args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=_tokenizer(),
                             callbacks=[AccumguardCallback()] if callback else None)
        t0 = time.process_time()
        trainer.train()
        return time.process_time() - t0


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1",
                                   unk_token="t2")


def run_lightning(steps: int, callback: bool) -> float:
    import pytorch_lightning as pl

    from accumguard.integrations.lightning import AccumguardCallback

    class LM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama(0)

        def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
            logits = self.model(input_ids=batch["input_ids"]).logits[:, :-1]
            labels = batch["labels"][:, 1:]
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                     ignore_index=-100, reduction="sum")

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    loader = torch.utils.data.DataLoader(_rows(steps * K * MICRO), batch_size=MICRO,
                                         collate_fn=_collate)
    with tempfile.TemporaryDirectory() as out:
        trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=K, accelerator="cpu",
                             devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=out,
                             callbacks=[AccumguardCallback(exact=True)] if callback else [])
        module = LM()
        t0 = time.process_time()
        trainer.fit(module, loader)
        return time.process_time() - t0


def run_accelerate(steps: int, callback: bool) -> float:
    from accelerate import Accelerator

    from accumguard.integrations.accelerate import watch

    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = tiny_llama(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(_rows(steps * K * MICRO), batch_size=MICRO,
                                         collate_fn=_collate)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    checks = watch(accelerator, model, opt) if callback else None
    t0 = time.process_time()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    spent = time.process_time() - t0
    if checks is not None:
        checks.close()
    accelerator.free_memory()
    return spent


STACKS: dict[str, Callable[[int, bool], float]] = {
    "trainer": run_trainer, "trl": run_trl, "lightning": run_lightning,
    "accelerate": run_accelerate,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", default=",".join(STACKS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    for name in ("accumguard", "transformers", "pytorch_lightning", "lightning", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(f"load average {os.getloadavg()[0]:.1f}; K={K}, {args.steps} optimizer steps per run, "
          f"{args.reps} alternating repetitions, process CPU time of the training call")
    print("| stack | s/step without | with / without (median) | IQR |")
    print("|---|---|---|---|")
    for name in args.stacks.split(","):
        run = STACKS[name]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run(2, False)  # imports and first-call costs out of the timings
        plain, ratios = [], []
        for rep in range(args.reps):
            got: dict[bool, float] = {}
            for cb in ((False, True) if rep % 2 == 0 else (True, False)):
                with contextlib.redirect_stdout(io.StringIO()), \
                        contextlib.redirect_stderr(io.StringIO()):
                    got[cb] = run(args.steps, cb)
            plain.append(got[False] / args.steps)
            ratios.append(got[True] / got[False])
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"| {name} | {statistics.median(plain):.4f} | {statistics.median(ratios):.3f} | "
              f"{q[0]:.3f}-{q[2]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
