"""Stock HF Trainer on a PEFT LoRA tiny Llama: answer-only SFT with prompts of varying length,
3-3-2 accumulation windows (8 micro-batches per rank per epoch, GA 3), a clip that acts and
a DataLoader worker. 2 ranks via torchrun.
"""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments,
                          default_data_collator, set_seed)

SEED, VOCAB, SEQ = 5, 64, 16


class VarPromptSFT(Dataset):
    def __init__(self, n=32):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(2, VOCAB, (n, SEQ), generator=g)
        self.ids[:, 8:] = (self.ids[:, :8] + 5) % VOCAB
        self.plen = torch.randint(2, 12, (n,), generator=g)  # prompt length varies per row

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[: int(self.plen[i])] = -100
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": labels}


def main():
    set_seed(SEED)
    torch.use_deterministic_algorithms(True)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=32))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "down_proj"],
                                            modules_to_save=["lm_head"]))
    args = TrainingArguments(
        output_dir="tmp_scratch/b_c01_out", per_device_train_batch_size=2,
        gradient_accumulation_steps=3, num_train_epochs=3, learning_rate=5e-3,
        lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.5, seed=SEED,
        use_cpu=True, ddp_backend="gloo", dataloader_num_workers=1,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=VarPromptSFT(),
                      data_collator=default_data_collator)
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
