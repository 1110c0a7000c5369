"""HF Trainer on a PEFT LoRA adapter with gradient checkpointing (2 ranks, GA 2).

The optimizer and its warm-up/linear-decay schedule are built by hand and handed
to the Trainer; the schedule's horizon is counted in optimizer steps
(ceil(micro-batches per rank / K) per epoch).  Each rank sees 5 micro-batches per
epoch, so the windows are 2-2-1; the stock Trainer loss over num_items_in_batch.
"""
import hashlib
import math
import os

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

SEED = 21
GA = 2
PER_DEVICE = 2
EPOCHS = 3
N = 20  # 2 ranks x 5 micro-batches x 2


class LMData(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(0, 90, (N, 20), generator=g)
        self.plen = torch.randint(3, 16, (N,), generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        lab = self.ids[i].clone()
        lab[: self.plen[i]] = -100
        return {"input_ids": self.ids[i], "labels": lab}


def main():
    set_seed(SEED)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=90, n_positions=32, n_embd=32, n_layer=2, n_head=4))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn", "c_proj"],
                                            fan_in_fan_out=True, lora_dropout=0.0))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    micro_per_rank = math.ceil(N / (PER_DEVICE * world))
    total_steps = math.ceil(micro_per_rank / GA) * EPOCHS
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3, weight_decay=0.0)
    warm = 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total_steps - s) / (total_steps - warm)))
    args = TrainingArguments(
        output_dir="tmp_scratch/c03_out", per_device_train_batch_size=PER_DEVICE, gradient_accumulation_steps=GA,
        num_train_epochs=EPOCHS, gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}, max_grad_norm=0.0, seed=SEED, data_seed=SEED,
        use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=100,
    )
    trainer = Trainer(model=model, args=args, train_dataset=LMData(), optimizers=(opt, sched))
    assert trainer.accelerator.num_processes == 2
    trainer.train()
    if trainer.accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
