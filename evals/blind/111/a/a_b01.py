"""Completion-only SFT of a tiny Llama with the HF Trainer on 2 ranks.

Warm-up / stable / decay (WSD) learning-rate schedule: the warm-up is a ratio the
Trainer resolves itself, the decay length is planned by `plan_schedule` from the
run config and handed over through `lr_scheduler_kwargs`.
"""
import hashlib
import math
import os
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class RunConfig:
    n_examples: int = 192
    per_device_bs: int = 4
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    warmup_ratio: float = 0.1
    decay_frac: float = 0.25
    seed: int = 1234
    world: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", "1")))


def plan_schedule(cfg: RunConfig) -> dict:
    # number of batches each rank sees per epoch, times epochs
    batches_per_rank = math.ceil(cfg.n_examples / (cfg.per_device_bs * cfg.world))
    planned_updates = batches_per_rank * cfg.epochs
    return {"num_decay_steps": int(cfg.decay_frac * planned_updates), "decay_type": "cosine", "min_lr_ratio": 0.05}


class PromptCompletionSet(Dataset):
    """Synthetic prompt -> completion pairs; the prompt is masked out of the labels."""

    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p_len = int(torch.randint(3, 8, (1,), generator=g))
            c_len = int(torch.randint(2, 9, (1,), generator=g))
            prompt = torch.randint(4, vocab, (p_len,), generator=g)
            completion = (prompt[:c_len].flip(0) + 1) % vocab if c_len <= p_len else torch.randint(4, vocab, (c_len,), generator=g)
            ids = torch.cat([torch.tensor([1]), prompt, torch.tensor([2]), completion, torch.tensor([3])])
            labels = ids.clone()
            labels[: p_len + 2] = -100
            self.items.append((ids, labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, labels = self.items[i]
        return {"input_ids": ids, "labels": labels}


def collate(batch):
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), n, dtype=torch.long)
    lab = torch.full((len(batch), n), -100, dtype=torch.long)
    att = torch.zeros(len(batch), n, dtype=torch.long)
    for i, b in enumerate(batch):
        L = len(b["input_ids"])
        ids[i, :L] = b["input_ids"]
        lab[i, :L] = b["labels"]
        att[i, :L] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def main():
    cfg = RunConfig()
    torch.manual_seed(cfg.seed)
    mcfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(mcfg)
    train_set = PromptCompletionSet(cfg.n_examples, mcfg.vocab_size, seed=7)

    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        weight_decay=0.01,
        lr_scheduler_type="warmup_stable_decay",
        warmup_steps=cfg.warmup_ratio,
        lr_scheduler_kwargs=plan_schedule(cfg),
        max_grad_norm=0.0,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collate)
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
