"""HF Trainer + PEFT LoRA on a tiny Llama, 2 ranks, K 3 over 7-batch epochs (3-3-1 windows),
masked prompts, a Trainer subclass with its own LoRA+-style optimizer, clipping at 0.5."""
import hashlib

import numpy as np
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

VOCAB, SEQ = 112, 14


class MaskedPrompts(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(2, VOCAB, (n, SEQ), generator=g)
        self.plen = torch.randint(3, 9, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[: self.plen[i]] = -100
        return {"input_ids": self.ids[i], "labels": labels}


class LoraPlusTrainer(Trainer):
    """B matrices get 8x the learning rate of A matrices; the saved head gets no decay."""

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            a, b, other = [], [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (b if "lora_B" in n else a if "lora_A" in n else other).append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW([
                {"params": a, "lr": lr, "weight_decay": 0.01},
                {"params": b, "lr": 8 * lr, "weight_decay": 0.01},
                {"params": other, "lr": lr, "weight_decay": 0.0},
            ])
        return self.optimizer


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0, modules_to_save=["lm_head"]))
    args = TrainingArguments(
        output_dir="tmp_scratch/a_c01_out", per_device_train_batch_size=2,
        gradient_accumulation_steps=3, num_train_epochs=3, learning_rate=2e-3,
        lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.5,
        save_strategy="no", report_to="none", use_cpu=True, ddp_backend="gloo",
        ddp_find_unused_parameters=False, seed=0, data_seed=0, disable_tqdm=True,
        logging_steps=100,
    )
    trainer = LoraPlusTrainer(model=model, args=args, train_dataset=MaskedPrompts(28))
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().numpy().astype(np.float32).tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
