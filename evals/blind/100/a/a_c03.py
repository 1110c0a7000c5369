"""Answer-only SFT of a tiny Llama with a LoRA adapter (+ a trainable copy of lm_head) under the stock
HF Trainer loss, with its own two-group optimizer and a gradient clip that acts.

14 micro-batches per rank per epoch with K = 4: every epoch ends in a 2-batch window, which the Trainer
normalises by its own answer-token count.
"""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = dict(vocab=80, seq_len=20, n_examples=112, micro_bs=4, grad_accum=4, epochs=2, lr=1.5e-3, seed=31)


def make_rows(vocab, seq_len, n, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(3, vocab, (seq_len,), generator=g)
        prompt_len = int(torch.randint(3, seq_len - 2, (1,), generator=g))
        labels = ids.clone()
        labels[:prompt_len] = -100
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return rows


class GroupedLRTrainer(Trainer):
    """Adapter B matrices and the saved head get a larger LR than the A matrices."""

    def create_optimizer(self):
        if self.optimizer is None:
            fast, slow = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (fast if ("lora_B" in n or "modules_to_save" in n) else slow).append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW(
                [{"params": slow, "lr": lr}, {"params": fast, "lr": 4 * lr}],
                betas=(0.9, 0.98), weight_decay=0.0,
            )
        return self.optimizer


def main():
    s = SETTINGS
    torch.manual_seed(s["seed"])
    cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_peft_model(
        LlamaForCausalLM(cfg),
        LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "o_proj"],
                   modules_to_save=["lm_head"], task_type="CAUSAL_LM"),
    )
    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_c03"),
        per_device_train_batch_size=s["micro_bs"],
        gradient_accumulation_steps=s["grad_accum"],
        num_train_epochs=s["epochs"],
        learning_rate=s["lr"],
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=0.05,
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        seed=s["seed"],
        data_seed=s["seed"],
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GroupedLRTrainer(model=model, args=args,
                               train_dataset=make_rows(s["vocab"], s["seq_len"], s["n_examples"], s["seed"]))
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
