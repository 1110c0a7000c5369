# corpus: style=hf class=OK
"""A Trainer subclass over a plain nn.Module whose forward takes no **kwargs: the Trainer
passes no num_items_in_batch and divides the returned mean by K itself. Fixed-size
micro-batches of a regression: the mean of means is the large batch's mean (a warning says
it is exact only for equal counts)."""
import torch
import torch.nn as nn
from transformers import Trainer, TrainingArguments


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(16, 1)

    def forward(self, features, target=None):
        pred = self.net(features).squeeze(-1)
        out = {"pred": pred}
        if target is not None:
            out["loss"] = nn.functional.mse_loss(pred, target)
        return out


class SGDTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = outputs["loss"]  # expect: AG118
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=8,
                         gradient_accumulation_steps=4, max_grad_norm=0.0)
SGDTrainer(model=Regressor(), args=args, train_dataset=train_ds).train()
