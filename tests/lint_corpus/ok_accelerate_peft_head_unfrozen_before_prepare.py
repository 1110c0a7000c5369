# corpus: style=accelerate class=OK
"""Accelerate + PEFT: the base model's head is unfrozen before prepare() wraps the model, so
DDP averages it with the adapters."""
import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model


class Trainer:
    def __init__(self, base, loader):
        self.accelerator = Accelerator(gradient_accumulation_steps=4)
        model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        self.head_params = list(model.get_base_model().lm_head.parameters())
        for p in self.head_params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def fit(self, epochs):
        for epoch in range(epochs):
            for batch in self.loader:
                with self.accelerator.accumulate(self.model):
                    self.accelerator.backward(self.model(**batch).loss)
                    self.opt.step()
                    self.opt.zero_grad()
