"""Trainer subclass: hand-written shifted token loss, a frozen embedding, two
AdamW groups and an acting clip, on epochs whose last window is short (3-3-2)."""
import hashlib
import os

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

PAD = 0


class Rows(Dataset):
    def __init__(self, n, vocab, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.data = []
        for _ in range(n):
            L = int(torch.randint(5, 15, (1,), generator=g))
            prompt = int(torch.randint(1, 4, (1,), generator=g))
            ids = torch.randint(1, vocab, (L,), generator=g)
            self.data.append((ids, prompt))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        ids, prompt = self.data[i]
        return {"input_ids": ids, "prompt_len": prompt}


def collate(batch):
    W = max(len(b["input_ids"]) for b in batch)
    ids = torch.full((len(batch), W), PAD)
    att = torch.zeros((len(batch), W), dtype=torch.long)
    lab = torch.full((len(batch), W), -100)
    for i, b in enumerate(batch):
        n = len(b["input_ids"])
        ids[i, :n] = b["input_ids"]
        att[i, :n] = 1
        lab[i, b["prompt_len"]:n] = b["input_ids"][b["prompt_len"]:]
    return {"input_ids": ids, "attention_mask": att, "labels": lab}


class TokenSumTrainer(Trainer):
    # our loss is already normalised over the whole accumulated (all-ranks) window
    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits[:, :-1].float()
        target = labels[:, 1:]
        tok_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100, reduction="sum")
        loss = tok_sum / num_items_in_batch * self.accelerator.num_processes
        return (loss, out) if return_outputs else loss

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            m = self.model
            attn = [p for n, p in m.named_parameters() if p.requires_grad and "self_attn" in n]
            rest = [p for n, p in m.named_parameters() if p.requires_grad and "self_attn" not in n]
            self.optimizer = torch.optim.AdamW(
                [{"params": attn, "lr": 3e-3, "weight_decay": 0.0}, {"params": rest, "lr": 1e-3, "weight_decay": 0.01}]
            )
        return self.optimizer


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         pad_token_id=PAD, tie_word_embeddings=False))
    model.model.embed_tokens.weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir="tmp_scratch/b_c01_out", per_device_train_batch_size=2, gradient_accumulation_steps=3,
        num_train_epochs=2, lr_scheduler_type="linear", warmup_steps=1, max_grad_norm=0.3, use_cpu=True,
        seed=0, data_seed=0, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = TokenSumTrainer(model=model, args=args, train_dataset=Rows(32, 80), data_collator=collate)
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        print("FINAL_SHA256", params_sha256(trainer.model), flush=True)


if __name__ == "__main__":
    main()
