# corpus: style=hf_trainer class=F9
"""Fine-tune with the HF Trainer; options left unset keep the library's defaults."""
import argparse

from transformers import Trainer, TrainingArguments


def cli():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output_dir", default="out")
    ap.add_argument("--gradient_accumulation_steps", type=int, default=8)
    ap.add_argument("--learning_rate", type=float, default=2e-5)
    ap.add_argument("--max_grad_norm", type=float, default=None,
                    help="gradient clipping threshold; leave unset to disable clipping")
    return ap.parse_args()


def run(model, train_ds):
    opts = cli()
    given = {name: val for name, val in vars(opts).items() if val is not None}
    targs = TrainingArguments(report_to="none", **given)  # expect: AG177
    Trainer(model=model, args=targs, train_dataset=train_ds).train()
