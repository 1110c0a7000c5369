"""HF Trainer subclass fine-tuning a PEFT LoRA adapter on a tiny random Llama: a LoRA+-style
`create_optimizer` (B matrices at a higher LR, two AdamW groups), a label-smoothed token loss
passed as `compute_loss_func` over `num_items_in_batch`, prompts masked out of the labels,
epochs of 7 micro-batches per rank with K = 2 (windows 2-2-2-1) and a clip of 0.15 that acts on most steps."""
import hashlib
import os

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

SEED = 3
VOCAB = 80
MAX_LEN = 20


def make_rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p = int(torch.randint(2, 8, (1,), generator=g))
        c = int(torch.randint(1, 10, (1,), generator=g))
        prompt = torch.randint(4, VOCAB, (p,), generator=g)
        comp = (torch.arange(c) * 7 + prompt[0]) % VOCAB
        ids = torch.cat([torch.tensor([1]), prompt, torch.tensor([3]), comp, torch.tensor([2])])
        labels = ids.clone()
        labels[: p + 2] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def pad_collate(features):
    n = len(features)
    ids = torch.zeros((n, MAX_LEN), dtype=torch.long)
    lab = torch.full((n, MAX_LEN), -100, dtype=torch.long)
    att = torch.zeros((n, MAX_LEN), dtype=torch.long)
    for i, f in enumerate(features):
        L = len(f["input_ids"])
        ids[i, :L], lab[i, :L], att[i, :L] = f["input_ids"], f["labels"], 1
    return {"input_ids": ids, "attention_mask": att, "labels": lab}


def smoothed_token_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs["logits"][:, :-1].float()
    target = labels[:, 1:]
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                            ignore_index=-100, label_smoothing=0.1, reduction="sum")
    return total / num_items_in_batch


class LoraPlusTrainer(Trainer):
    lora_b_ratio = 4.0

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            a_params, b_params = [], []
            for name, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (b_params if "lora_B" in name else a_params).append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW([
                {"params": a_params, "lr": lr, "weight_decay": 0.01},
                {"params": b_params, "lr": lr * self.lora_b_ratio, "weight_decay": 0.0},
            ], betas=(0.9, 0.99))
        return self.optimizer


def main():
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "out_c03"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=4e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=0.15,
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = LoraPlusTrainer(model=model, args=args, train_dataset=make_rows(56, SEED),
                              data_collator=pad_collate, compute_loss_func=smoothed_token_loss)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
