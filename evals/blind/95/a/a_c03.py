"""PEFT LoRA adapter + a fully trained head (modules_to_save) with Accelerate on 2 ranks.

Two prepared optimizers (AdamW for the adapter, SGD-momentum for the saved head) and their
two prepared schedulers, stepped together inside accelerator.accumulate(); a clip of 0.3 on
sync steps only (acts); a DataLoader with one worker process. 16 micro-batches per rank per
epoch, K = 4, 2 epochs.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model

K = 4
EPOCHS = 2
MICRO = 4


class Backbone(nn.Module):
    def __init__(self, d=24, n_out=3):
        super().__init__()
        self.query = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.ff = nn.Linear(d, d)
        self.classifier = nn.Linear(d, n_out)

    def forward(self, x):
        h = torch.tanh(self.query(x)) * self.value(x)
        h = h + F.gelu(self.ff(h))
        return self.classifier(h)


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    set_seed(99)
    base = Backbone()
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"],
                      modules_to_save=["classifier"])
    model = get_peft_model(base, lora)

    adapter_params = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    head_params = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    opt_a = torch.optim.AdamW(adapter_params, lr=5e-3, weight_decay=0.0)
    opt_h = torch.optim.SGD(head_params, lr=0.05, momentum=0.9)
    n_steps = EPOCHS * 16 // K
    sch_a = torch.optim.lr_scheduler.LinearLR(opt_a, 1.0, 0.2, total_iters=n_steps * accelerator.num_processes)
    sch_h = torch.optim.lr_scheduler.CosineAnnealingLR(opt_h, T_max=n_steps * accelerator.num_processes)

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2 * 16 * MICRO, 24, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=MICRO, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(4))

    model, opt_a, opt_h, sch_a, sch_h, loader = accelerator.prepare(model, opt_a, opt_h, sch_a, sch_h, loader)
    model.train()
    for epoch in range(EPOCHS):
        for x_b, y_b in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x_b), y_b)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.3)
                for opt, sch in ((opt_a, sch_a), (opt_h, sch_h)):
                    opt.step()
                    sch.step()
                    opt.zero_grad()
        accelerator.print(f"epoch {epoch} loss {loss.item():.4f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("FINAL_SHA256", sha_of(accelerator.unwrap_model(model)))
    accelerator.end_training()


if __name__ == "__main__":
    main()
