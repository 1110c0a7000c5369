"""Stock HF Trainer on a LoRA adapter plus a trained lm_head copy
(`modules_to_save`), gradient checkpointing, a DataLoader worker, a clip at 0.5
and epochs of 9 micro-batches per rank at K = 4 (4-4-1 windows)."""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


class PromptAnswer(Dataset):
    def __init__(self, n, vocab, seed=9):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p = int(torch.randint(2, 7, (1,), generator=g))
            a = int(torch.randint(1, 9, (1,), generator=g))
            self.items.append((torch.randint(2, vocab, (p + a,), generator=g), p))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class Collator:
    pad_id = 0

    def __call__(self, batch):
        width = max(len(x) for x, _ in batch)
        ids = torch.full((len(batch), width), self.pad_id)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (x, p) in enumerate(batch):
            ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
            labels[i, p : len(x)] = x[p:]
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0, tie_word_embeddings=False))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["lm_head"]))
    args = TrainingArguments(
        output_dir="tmp_scratch/b_c03_out", per_device_train_batch_size=2, gradient_accumulation_steps=4,
        num_train_epochs=2, learning_rate=5e-3, lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.5,
        gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
        dataloader_num_workers=1, use_cpu=True, seed=0, data_seed=0, report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptAnswer(36, 64), data_collator=Collator())
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        print("FINAL_SHA256", params_sha256(trainer.model), flush=True)


if __name__ == "__main__":
    main()
