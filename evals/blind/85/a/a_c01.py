"""HF Trainer + PEFT LoRA on a tiny randomly initialised Llama, 2 ranks (torchrun), K=3.
Variable-length prompts/completions with the prompt masked out (-100); an epoch of 11
micro-batches per rank, so every epoch ends in a short window of 2; clipping at 0.5."""
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed
from peft import LoraConfig, get_peft_model

SEED = 5
PAD = 0


class PromptCompletion(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            lp = int(torch.randint(3, 9, (1,), generator=g))
            lc = int(torch.randint(2, 12, (1,), generator=g))
            ids = torch.randint(1, vocab, (lp + lc,), generator=g)
            labels = ids.clone()
            labels[:lp] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), L), PAD, dtype=torch.long)
    lab = torch.full((len(rows), L), -100, dtype=torch.long)
    att = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = r["input_ids"]
        lab[i, :n] = r["labels"]
        att[i, :n] = 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
                      modules_to_save=["lm_head"], task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)

    args = TrainingArguments(
        output_dir="/tmp/a_c01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=0.5,
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_steps=2,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletion(44, cfg.vocab_size, SEED),
                      data_collator=collate)
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"global_step {trainer.state.global_step}")
        print(f"FINAL_SHA256 {params_sha(trainer.model)}")


if __name__ == "__main__":
    main()
