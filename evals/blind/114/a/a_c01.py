# Instruction tuning through a LoRA adapter (plus a fully trained lm_head copy via modules_to_save)
# with the stock HF Trainer. Prompts are masked out of the loss, answers have ragged lengths,
# and a callback clips the adapter and the head separately right before the optimizer step.
import hashlib
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments,
                          set_seed)

SEED = 5
VOCAB = 112
K = 2
PER_DEVICE = 2
EPOCHS = 3
N_SAMPLES = 20  # 10 per rank -> 5 micro-batches per epoch -> windows of 2, 2, 1
PAD = 0


class RaggedSFT(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(SEED)
        self.rows = []
        for _ in range(N_SAMPLES):
            p_len = int(torch.randint(3, 9, (1,), generator=g))
            a_len = int(torch.randint(2, 12, (1,), generator=g))
            ids = torch.randint(1, VOCAB, (p_len + a_len,), generator=g)
            labels = ids.clone()
            labels[:p_len] = -100
            self.rows.append((ids, labels))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, labels = self.rows[i]
        return {"input_ids": ids, "labels": labels}


def pad_collate(rows):
    width = max(r["input_ids"].numel() for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        n = r["input_ids"].numel()
        ids[j, :n] = r["input_ids"]
        labels[j, :n] = r["labels"]
        mask[j, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class SplitClipCallback(TrainerCallback):
    """Clip the LoRA factors and the saved lm_head copy with separate budgets."""

    def __init__(self, lora_norm=0.05, head_norm=0.2):
        self.lora_norm = lora_norm
        self.head_norm = head_norm

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        lora = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
        head = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
        torch.nn.utils.clip_grad_norm_(lora, self.lora_norm)
        torch.nn.utils.clip_grad_norm_(head, self.head_norm)


def main():
    set_seed(SEED)
    torch.manual_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                                        tie_word_embeddings=False, pad_token_id=PAD))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["lm_head"], task_type="CAUSAL_LM"))
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c01_out"),
        per_device_train_batch_size=PER_DEVICE, gradient_accumulation_steps=K, num_train_epochs=EPOCHS,
        learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=1, weight_decay=0.0,
        max_grad_norm=0.0,  # clipping is done by SplitClipCallback
        seed=SEED, data_seed=SEED, use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
        logging_steps=3, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=RaggedSFT(), data_collator=pad_collate,
                      callbacks=[SplitClipCallback()])
    trainer.train()

    h = hashlib.sha256()
    for _, p in trainer.model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
