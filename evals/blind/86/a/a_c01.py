"""Completion-only SFT of a tiny GPT-2 with a Trainer subclass (two param groups, resized vocab).

Launch: torchrun --nproc-per-node 2 ... a_c01.py
"""
import hashlib
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

PAD = 0
IGNORE = -100


@dataclass
class SFTConfig:
    vocab: int = 60
    new_tokens: int = 4          # two chat-role tokens + two reserved, added after pretraining
    n_samples: int = 28          # 14 per rank, micro-batch 2 -> 7 micro-batches: windows of 3, 3, 1
    per_device_bs: int = 2
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 3e-3
    emb_lr: float = 1e-3
    clip: float = 0.5
    seed: int = 21


class PromptCompletionSet(Dataset):
    """Variable prompt and completion lengths; only completion tokens carry labels."""

    def __init__(self, cfg: SFTConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.items = []
        for _ in range(cfg.n_samples):
            lp = int(torch.randint(2, 7, (1,), generator=g))
            lc = int(torch.randint(1, 9, (1,), generator=g))
            prompt = torch.randint(1, cfg.vocab, (lp,), generator=g)
            comp = torch.randint(1, cfg.vocab, (lc,), generator=g)
            role = torch.tensor([cfg.vocab + 1])  # new token id
            ids = torch.cat([prompt, role, comp])
            labels = torch.cat([torch.full((lp + 1,), IGNORE), comp])
            self.items.append((ids, labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, labels = self.items[i]
        return {"input_ids": ids, "labels": labels}


def collate(batch):
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), n), PAD)
    labels = torch.full((len(batch), n), IGNORE)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for i, b in enumerate(batch):
        k = len(b["input_ids"])
        ids[i, :k] = b["input_ids"]
        labels[i, :k] = b["labels"]
        mask[i, :k] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class GroupedLRTrainer(Trainer):
    def __init__(self, *args, sft_cfg: SFTConfig, **kwargs):
        self.sft_cfg = sft_cfg
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            emb, rest = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (emb if "wte" in n else rest).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": rest, "lr": self.sft_cfg.lr, "weight_decay": 0.01},
                 {"params": emb, "lr": self.sft_cfg.emb_lr, "weight_decay": 0.0}],
                betas=(0.9, 0.95),
            )
        return self.optimizer


def build_model(cfg: SFTConfig):
    mcfg = GPT2Config(vocab_size=cfg.vocab, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(mcfg)
    model.resize_token_embeddings(cfg.vocab + cfg.new_tokens)
    # learned positions stay as pretrained
    model.transformer.wpe.weight.requires_grad_(False)
    return model


def main():
    cfg = SFTConfig()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    model = build_model(cfg)
    args = TrainingArguments(
        output_dir="/tmp/wa86/hf_c01_out",
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=cfg.clip,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = GroupedLRTrainer(model=model, args=args, train_dataset=PromptCompletionSet(cfg),
                               data_collator=collate, sft_cfg=cfg)
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"optimizer steps: {trainer.state.global_step}")
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
