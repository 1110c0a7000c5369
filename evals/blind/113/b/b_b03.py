"""LoRA SFT with a trained output head under an HF Trainer subclass (2 ranks).

The adapter and the head get separate AdamW groups, each with its own gradient
norm limit; the Trainer's global clip is switched off and a callback clips each
group before the optimizer step.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)
from peft import LoraConfig, get_peft_model

SEED = 77
VOCAB = 80
GROUP_CLIP = {"adapter": 0.05, "head": 0.2}


class ChatSFTData(Dataset):
    def __init__(self, n=40, seed=SEED):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            n_prompt = int(torch.randint(3, 7, (1,), generator=g))
            n_answer = int(torch.randint(2, 9, (1,), generator=g))
            ids = torch.randint(4, VOCAB, (n_prompt + n_answer,), generator=g)
            labels = ids.clone()
            labels[:n_prompt] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pad_collate(rows):
    width = max(len(r["input_ids"]) for r in rows)
    out = {"input_ids": torch.zeros(len(rows), width, dtype=torch.long),
           "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
           "labels": torch.full((len(rows), width), -100, dtype=torch.long)}
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        out["input_ids"][i, :n] = r["input_ids"]
        out["attention_mask"][i, :n] = 1
        out["labels"][i, :n] = r["labels"]
    return out


class GroupedAdamTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            adapter, head = [], []
            for name, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (head if "lm_head" in name else adapter).append(p)
            self.optimizer = torch.optim.AdamW([
                {"params": adapter, "lr": 2e-3, "clip": GROUP_CLIP["adapter"], "name": "adapter"},
                {"params": head, "lr": 5e-4, "clip": GROUP_CLIP["head"], "name": "head"},
            ], weight_decay=0.0)
        return self.optimizer


class PerGroupClip(TrainerCallback):
    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        for group in optimizer.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], group["clip"])


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"],
        modules_to_save=["lm_head"], init_lora_weights="gaussian"))

    args = TrainingArguments(
        output_dir="tmp_scratch/b03_out", per_device_train_batch_size=2, gradient_accumulation_steps=3,
        num_train_epochs=3, lr_scheduler_type="linear", warmup_steps=1, max_grad_norm=0.0,
        seed=SEED, data_seed=SEED, use_cpu=True, ddp_backend="gloo", save_strategy="no",
        report_to=[], logging_steps=50, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = GroupedAdamTrainer(model=model, args=args, train_dataset=ChatSFTData(),
                                 data_collator=pad_collate, callbacks=[PerGroupClip()])
    trainer.train()

    if trainer.is_world_process_zero():
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
