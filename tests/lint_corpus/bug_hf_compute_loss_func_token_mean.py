# corpus: style=hf_trainer class=LOSS_SCALE
# a focal loss handed to the Trainer as compute_loss_func, returning each micro-batch's token
# mean: the Trainer skips its / K and multiplies by the processes
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def make_focal_loss(gamma):
    def focal_loss(outputs, labels, num_items_in_batch=None):
        logp = F.log_softmax(outputs["logits"].float(), -1)
        mask = labels.ne(-100)
        lp = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        per_tok = -((1 - lp.exp()) ** gamma) * lp
        return per_tok[mask].mean()
    return focal_loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
trainer = Trainer(model=model, args=args, train_dataset=ds,
                  compute_loss_func=make_focal_loss(2.0))  # expect: AG336
trainer.train()
