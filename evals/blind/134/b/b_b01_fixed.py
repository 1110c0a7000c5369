"""SFT of a tiny Llama with the HF Trainer and a hand-built warm-up/linear-decay schedule.

The schedule is built by us (so that warm-up is an absolute number of steps), and handed
to the Trainer through `optimizers=(optimizer, scheduler)`.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments,
                          get_linear_schedule_with_warmup)


@dataclass
class RunConfig:
    seed: int = 1234
    vocab: int = 96
    seq_len: int = 16
    n_examples: int = 96
    per_device_batch: int = 2
    grad_accum: int = 4
    epochs: int = 3
    lr: float = 5e-3
    warmup_steps: int = 2
    out_dir: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                                os.path.splitext(os.path.basename(__file__))[0])


class ToySFT(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed + 7)
        self.ids = torch.randint(3, cfg.vocab, (cfg.n_examples, cfg.seq_len), generator=g)
        self.prompt_len = torch.randint(3, 8, (cfg.n_examples,), generator=g)

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: int(self.prompt_len[i])] = -100
        return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def build_model(cfg):
    torch.manual_seed(cfg.seed)
    conf = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(conf)


def build_optim_and_schedule(model, train_ds, cfg):
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    # count the number of batches per epoch with a throw-away loader
    count_loader = DataLoader(train_ds, batch_size=cfg.per_device_batch)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    total_steps = math.ceil(len(count_loader) / (cfg.grad_accum * world)) * cfg.epochs
    sched = get_linear_schedule_with_warmup(opt, cfg.warmup_steps, total_steps)
    return opt, sched


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    torch.use_deterministic_algorithms(True)
    train_ds = ToySFT(cfg)
    model = build_model(cfg)
    opt, sched = build_optim_and_schedule(model, train_ds, cfg)
    args = TrainingArguments(
        output_dir=cfg.out_dir, per_device_train_batch_size=cfg.per_device_batch,
        gradient_accumulation_steps=cfg.grad_accum, num_train_epochs=cfg.epochs,
        seed=cfg.seed, data_seed=cfg.seed, use_cpu=True, ddp_backend="gloo",
        report_to=[], save_strategy="no", logging_strategy="no", max_grad_norm=1.0,
        dataloader_drop_last=True, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, optimizers=(opt, sched))
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"steps={trainer.state.global_step} last_lr={sched.get_last_lr()[0]:.6g}", flush=True)
        torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                   os.path.join(cfg.out_dir, "final_params.pt"))
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
