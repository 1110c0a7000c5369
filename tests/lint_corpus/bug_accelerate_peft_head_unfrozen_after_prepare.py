# corpus: style=accelerate class=F10
"""Accelerate + PEFT: the base model's head, frozen by get_peft_model, is unfrozen at epoch 1,
after prepare() wrapped the model in DDP: never averaged over the ranks (blind round 123
b_b03)."""
import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model


class Trainer:
    def __init__(self, base, loader):
        self.accelerator = Accelerator(gradient_accumulation_steps=4)
        model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        self.head_params = list(model.get_base_model().lm_head.parameters())
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad] + self.head_params)
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def maybe_unfreeze(self, epoch):
        if epoch == 1:
            for p in self.head_params:
                p.requires_grad_(True)  # expect: AG346

    def fit(self, epochs):
        for epoch in range(epochs):
            self.maybe_unfreeze(epoch)
            for batch in self.loader:
                with self.accelerator.accumulate(self.model):
                    self.accelerator.backward(self.model(**batch).loss)
                    self.opt.step()
                    self.opt.zero_grad()
