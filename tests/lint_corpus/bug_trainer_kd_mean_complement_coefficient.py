# corpus: style=hf_trainer class=LOSS_SCALE
# distillation: the CE goes through the model with num_items_in_batch (the window's token
# mean: the Trainer then does not divide by K), the KD term is this micro-batch's mean
# under a coefficient written as (1 - alpha): summed over the window it weighs K x
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
                      log_target=True, reduction="none").sum(-1).mean()
        loss = self.alpha * out.loss + (1.0 - self.alpha) * kd  # expect: AG142
        return (loss, out) if return_outputs else loss


def main(student, teacher, ds):
    args = TrainingArguments("out", gradient_accumulation_steps=4, per_device_train_batch_size=2)
    KDTrainer(model=student, teacher=teacher, args=args, train_dataset=ds).train()
