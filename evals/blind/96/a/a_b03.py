"""LoRA fine-tuning of a tiny Llama with Accelerate; token-level loss normalised over the whole
accumulated batch (the recipe from the Accelerate gradient-accumulation guide)."""
import hashlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

VOCAB, MAXLEN, PAD = 128, 32, 0
CFG = dict(micro_bs=2, grad_accum=4, epochs=2, lr=4e-3, warmup=2, n_rows=64, seed=11)


class ChatRows(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            plen = int(torch.randint(3, 10, (1,), generator=g))
            clen = int(torch.randint(2, MAXLEN - plen, (1,), generator=g))
            ids = torch.randint(1, VOCAB, (plen + clen,), generator=g)
            self.rows.append((ids, plen))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    ids = torch.full((len(rows), MAXLEN), PAD, dtype=torch.long)
    labels = torch.full((len(rows), MAXLEN), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), MAXLEN), dtype=torch.long)
    for r, (seq, plen) in enumerate(rows):
        ids[r, : len(seq)] = seq
        mask[r, : len(seq)] = 1
        labels[r, plen : len(seq)] = seq[plen:]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def token_loss_sum(logits, labels):
    logits = logits[:, :-1].float()
    labels = labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="sum")


def n_targets(batches):
    return sum(int(b["labels"][:, 1:].ne(-100).sum()) for b in batches)


def main():
    set_seed(CFG["seed"])
    accelerator = Accelerator(
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=CFG["grad_accum"], sync_with_dataloader=False),
        cpu=True,
    )
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]))
    loader = DataLoader(ChatRows(CFG["n_rows"], CFG["seed"]), batch_size=CFG["micro_bs"], shuffle=True, collate_fn=collate)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=CFG["lr"], weight_decay=0.0)
    updates_per_epoch = math.ceil(CFG["n_rows"] / (CFG["micro_bs"] * accelerator.num_processes)) // CFG["grad_accum"]
    total_updates = updates_per_epoch * CFG["epochs"]
    scheduler = get_linear_schedule_with_warmup(optimizer, CFG["warmup"] * accelerator.num_processes,
                                                total_updates * accelerator.num_processes)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    for epoch in range(CFG["epochs"]):
        it = iter(loader)
        for update in range(updates_per_epoch):
            window = [next(it) for _ in range(CFG["grad_accum"])]
            num_items = torch.tensor(n_targets(window), device=accelerator.device)
            for batch in window:
                with accelerator.accumulate(model):
                    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                    loss = token_loss_sum(out.logits, batch["labels"]) / num_items
                    # accelerator.backward divides by grad_accum and DDP averages over processes
                    loss = loss * CFG["grad_accum"] * accelerator.num_processes
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        m = accelerator.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in m.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest(), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
