"""SFT of a LoRA adapter with the stock HF Trainer: prompt tokens masked, label smoothing,
3-3-2 accumulation windows per epoch, clipping at 0.1 (it acts) and a cosine schedule with warm-up."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed
from peft import LoraConfig, get_peft_model

VOCAB, SEQ = 128, 24
PAD_ID = 0


class PromptCompletion(Dataset):
    """Prompt + completion pairs; only completion tokens are trained."""

    def __init__(self, n=32, seed=5):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            total = int(torch.randint(10, SEQ + 1, (1,), generator=g))
            prompt = int(torch.randint(3, total - 2, (1,), generator=g))
            ids = torch.full((SEQ,), PAD_ID, dtype=torch.long)
            ids[:total] = torch.randint(1, VOCAB, (total,), generator=g)
            labels = ids.clone()
            labels[:prompt] = -100
            labels[total:] = -100
            attn = torch.zeros(SEQ, dtype=torch.long)
            attn[:total] = 1
            self.rows.append({"input_ids": ids, "attention_mask": attn, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD_ID, tie_word_embeddings=False)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    # LoRA B starts at zero; give it a small random start so the first steps move every adapter
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c01_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,   # 8 micro-batches per rank per epoch -> windows of 3, 3, 2
        num_train_epochs=2,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        label_smoothing_factor=0.1,
        max_grad_norm=0.1,
        weight_decay=0.01,
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        remove_unused_columns=False,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletion(), data_collator=collate)
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {final_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
