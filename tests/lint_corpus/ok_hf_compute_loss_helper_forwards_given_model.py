# corpus: style=hf_trainer class=OK
# the same helper given the model compute_loss is handed
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class PairTrainer(Trainer):
    def _scores(self, model, chosen, rejected):
        ids = torch.cat([chosen, rejected])
        scores = model(input_ids=ids).logits.squeeze(-1)
        return scores.chunk(2)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        r_c, r_r = self._scores(model, inputs["chosen"], inputs["rejected"])
        loss = -F.logsigmoid(r_c - r_r).mean()
        return (loss, {"chosen": r_c}) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
PairTrainer(model=model, args=args, train_dataset=ds).train()
