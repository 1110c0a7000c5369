"""LoRA SFT of a tiny Llama with the stock HF Trainer loop.

Completion-only labels (uneven supervised tokens per micro-batch), an epoch of 7
micro-batches per rank under K=3 (windows 3, 3, 1), a clip of 0.3 that acts, a Trainer
subclass with its own two-group optimizer and a callback that clears gradients at
the start of each optimizer step.
"""
import argparse
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from peft import LoraConfig, get_peft_model

PAD, BOS = 0, 1
VOCAB = 96


class PromptResponseData(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p_len = int(torch.randint(3, 10, (1,), generator=g))
            r_len = int(torch.randint(2, 14, (1,), generator=g))
            prompt = torch.randint(3, VOCAB, (p_len,), generator=g)
            response = (prompt.flip(0)[:r_len] * 7 + 5) % (VOCAB - 3) + 3
            if response.numel() < r_len:
                response = torch.cat([response, torch.randint(3, VOCAB, (r_len - response.numel(),), generator=g)])
            ids = torch.cat([torch.tensor([BOS]), prompt, response])
            labels = ids.clone()
            labels[: 1 + p_len] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    width = max(r["input_ids"].numel() for r in rows)
    ids = torch.full((len(rows), width), PAD)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = r["input_ids"].numel()
        ids[i, :n] = r["input_ids"]
        labels[i, :n] = r["labels"]
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class TwoGroupTrainer(Trainer):
    """LoRA A/B matrices at the base LR, the re-trained norm weights at a lower LR, no decay."""

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            lora, norms = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (lora if "lora_" in n else norms).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": lora, "lr": self.args.learning_rate},
                 {"params": norms, "lr": self.args.learning_rate * 0.25}],
                lr=self.args.learning_rate, betas=(0.9, 0.98), weight_decay=0.0)
        return self.optimizer


class ClearGradsAtStepBegin(TrainerCallback):
    """Defensive: make sure a new optimizer step starts from empty gradients."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            model.zero_grad(set_to_none=True)


def params_sha256(model):
    h = hashlib.sha256()
    flat = []
    for _, p in model.named_parameters():
        t = p.detach().float().cpu().contiguous()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if os.environ.get("A_DUMP"):
        torch.save(torch.cat(flat), os.environ["A_DUMP"])
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c01_out"))
    ap.add_argument("--grad-accum", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=21)
    cli = ap.parse_args()

    torch.manual_seed(cli.seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, bos_token_id=BOS, eos_token_id=BOS, tie_word_embeddings=False)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    for n, p in model.named_parameters():
        if n.endswith("norm.weight"):
            p.requires_grad_(True)

    args = TrainingArguments(
        output_dir=cli.output_dir,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=cli.grad_accum,
        num_train_epochs=cli.epochs,
        learning_rate=cli.lr,
        lr_scheduler_type="linear",
        warmup_steps=1,
        weight_decay=0.0,
        max_grad_norm=0.3,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        seed=cli.seed,
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = TwoGroupTrainer(model=model, args=args, train_dataset=PromptResponseData(28, cli.seed),
                              data_collator=collate, callbacks=[ClearGradsAtStepBegin()])
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
