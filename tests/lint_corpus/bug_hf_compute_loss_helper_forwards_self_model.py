# corpus: style=hf_trainer class=F10
# the pairwise scores come from a helper method that runs the Trainer's own module, not the
# (DDP-wrapped) model compute_loss is handed
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class PairTrainer(Trainer):
    def _scores(self, chosen, rejected):
        ids = torch.cat([chosen, rejected])
        scores = self.model(input_ids=ids).logits.squeeze(-1)  # expect: AG306
        return scores.chunk(2)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        r_c, r_r = self._scores(inputs["chosen"], inputs["rejected"])
        loss = -F.logsigmoid(r_c - r_r).mean()
        return (loss, {"chosen": r_c}) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
PairTrainer(model=model, args=args, train_dataset=ds).train()
