"""SFT of a tiny Llama with a custom Trainer subclass (completion-only labels)."""
import hashlib
import os
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


@dataclass
class RunConfig:
    seed: int = 1234
    vocab: int = 96
    seq_len: int = 24
    n_samples: int = 64
    per_device_bs: int = 4
    grad_accum: int = 4
    lr: float = 3e-3
    epochs: int = 2
    out_dir: str = "tmp_scratch/b02_out"


class PromptCompletionSet(Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.rows = []
        for _ in range(cfg.n_samples):
            ids = torch.randint(3, cfg.vocab, (cfg.seq_len,), generator=g)
            prompt_len = int(torch.randint(4, 18, (1,), generator=g))
            labels = ids.clone()
            labels[:prompt_len] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    return {
        "input_ids": torch.stack([r["input_ids"] for r in rows]),
        "labels": torch.stack([r["labels"] for r in rows]),
    }


class SFTTrainer(Trainer):
    """Trainer with its own training step (keeps a running token count for logging)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.tokens_seen_local = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        self.tokens_seen_local += int((inputs["labels"] != -100).sum())
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        self.accelerator.backward(loss)
        return loss.detach()


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    mcfg = LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(mcfg)
    args = TrainingArguments(
        output_dir=cfg.out_dir,
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.lr,
        num_train_epochs=cfg.epochs,
        lr_scheduler_type="linear",
        warmup_steps=1,
        weight_decay=0.0,
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=PromptCompletionSet(cfg), data_collator=collate)
    trainer.train()
    if trainer.args.process_index == 0:
        print("FINAL_SHA256", params_sha(trainer.model))


if __name__ == "__main__":
    main()
