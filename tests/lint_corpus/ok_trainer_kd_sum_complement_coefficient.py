# corpus: style=hf_trainer class=OK
# the KD term is summed over the tokens and divided by num_items_in_batch like the CE:
# both are the window's token means, whatever the coefficients
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class KDTrainer(Trainer):
    def __init__(self, *args, teacher=None, alpha=0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher, self.alpha = teacher, alpha

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs, num_items_in_batch=num_items_in_batch)
        t_logits = self.teacher(input_ids=inputs["input_ids"]).logits.detach()
        kd = F.kl_div(F.log_softmax(out.logits, -1), F.log_softmax(t_logits, -1),
                      log_target=True, reduction="none").sum(-1).sum() / num_items_in_batch
        loss = self.alpha * out.loss + (1.0 - self.alpha) * kd
        return (loss, out) if return_outputs else loss


def main(student, teacher, ds):
    args = TrainingArguments("out", gradient_accumulation_steps=4, per_device_train_batch_size=2)
    KDTrainer(model=student, teacher=teacher, args=args, train_dataset=ds).train()
