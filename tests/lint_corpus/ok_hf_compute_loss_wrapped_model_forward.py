# corpus: style=hf class=OK
"""The fixed twin of bug_hf_compute_loss_self_model_forward: the forward runs through the
model compute_loss is handed; self.model is read only for its config (blind round 127 b_b01
fixed)."""
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class RetrievalTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q, p = model(query_ids=inputs["query_ids"], passage_ids=inputs["passage_ids"])
        _ = self.model.config
        loss = F.cross_entropy(q @ p.T, torch.arange(len(q)), reduction="sum") / num_items_in_batch
        return (loss, q) if return_outputs else loss


def main(model, data):
    args = TrainingArguments(output_dir="o", gradient_accumulation_steps=4, ddp_backend="gloo")
    RetrievalTrainer(model=model, args=args, train_dataset=data).train()
