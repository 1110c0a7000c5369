"""Instruction tuning of a tiny Llama with the HF Trainer (answer-only loss).

Arguments are built in two stages, the way our recipe library does it: the run-level
settings (output, logging, precision, clipping, accumulation) go into the constructor,
and the optimisation block is applied afterwards with the TrainingArguments helper
methods so that sweeps only need to touch one place.
"""
import argparse
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

PROMPT_LEN_RANGE = (3, 9)
SEQ_LEN = 24
VOCAB = 96


class SyntheticSFT(Dataset):
    """Prompt + answer sequences; prompt tokens are masked out of the labels."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            ids = torch.randint(4, VOCAB, (SEQ_LEN,), generator=g)
            # the answer is a deterministic function of the prompt so it can be learned
            p = int(torch.randint(*PROMPT_LEN_RANGE, (1,), generator=g))
            ids[p:] = (ids[:SEQ_LEN - p] * 7 + 3) % (VOCAB - 4) + 4
            labels = ids.clone()
            labels[:p] = -100
            self.items.append({"input_ids": ids, "labels": labels,
                               "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--per-device-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--out", default="tmp_scratch/a_b02_out")
    return ap.parse_args()


def build_args(opts):
    args = TrainingArguments(
        output_dir=opts.out,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=2,
        disable_tqdm=True,
        dataloader_drop_last=False,
        max_grad_norm=opts.max_grad_norm,
        gradient_accumulation_steps=opts.grad_accum,
        data_seed=opts.seed,
    )
    args = args.set_training(learning_rate=opts.lr, batch_size=opts.per_device_batch,
                             num_epochs=opts.epochs, weight_decay=0.01, seed=opts.seed)
    args = args.set_lr_scheduler(name="linear", num_epochs=opts.epochs, warmup_steps=0.1)
    args = args.set_optimizer(name="adamw_torch", learning_rate=opts.lr, weight_decay=0.01,
                              beta1=0.9, beta2=0.98, epsilon=1e-8)
    return args


def digest(model, dump=None):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if dump:
        torch.save({n: p.detach().float().clone() for n, p in model.named_parameters()}, dump)
    return h.hexdigest()


def main():
    opts = parse()
    torch.use_deterministic_algorithms(True)
    args = build_args(opts)
    set_seed(opts.seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    train_ds = SyntheticSFT(128, seed=5)   # 128 / (2 ranks * 4) = 16 micro-batches per rank
    trainer = Trainer(model=model, args=args, train_dataset=train_ds)
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {digest(trainer.model, os.environ.get('DUMP_PARAMS'))}")


if __name__ == "__main__":
    main()
