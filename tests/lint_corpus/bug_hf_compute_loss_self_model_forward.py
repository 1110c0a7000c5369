# corpus: style=hf class=F10
"""A retrieval Trainer subclass encoding through self.model, the unwrapped module, instead of
the DDP-wrapped model compute_loss is handed (blind rounds 127 b_b01, 100 a_b01)."""
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class RetrievalTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q = self.model.encode(inputs["query_ids"])  # expect: AG306
        p = self.model.encode(inputs["passage_ids"])
        loss = F.cross_entropy(q @ p.T, torch.arange(len(q)), reduction="sum") / num_items_in_batch
        return (loss, q) if return_outputs else loss


def main(model, data):
    args = TrainingArguments(output_dir="o", gradient_accumulation_steps=4, ddp_backend="gloo")
    RetrievalTrainer(model=model, args=args, train_dataset=data).train()
