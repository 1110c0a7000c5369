# corpus: style=hf_trainer class=OK
# the reward head is added to the model before the Trainer wraps it: DDP averages it too
import torch
from transformers import Trainer, TrainingArguments


class RewardTrainer(Trainer):
    def __init__(self, model, head, **kwargs):
        self.head = head
        super().__init__(model=model, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                [{"params": self.model.parameters()},
                 {"params": self.head.parameters(), "lr": 1e-3}], lr=1e-5)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        h = model(input_ids=inputs["input_ids"]).last_hidden_state[:, -1]
        return torch.nn.functional.mse_loss(self.head(h).squeeze(-1), inputs["reward"])


head = torch.nn.Linear(64, 1)
backbone.add_module("reward_head", head)
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=1,
                         ddp_find_unused_parameters=False)
trainer = RewardTrainer(model=backbone, head=head, args=args, train_dataset=ds)
trainer.train()
