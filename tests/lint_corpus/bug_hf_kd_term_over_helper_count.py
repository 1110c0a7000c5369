# corpus: style=hf_trainer class=LOSS_SCALE
# distillation in a Trainer subclass: the model's CE is normalised by num_items_in_batch (so
# the Trainer does not divide by K), the KL term by this micro-batch's token count returned
# by a helper: summed over K micro-batches it weighs K times its coefficient
import torch
from transformers import Trainer, TrainingArguments


def kl_and_count(student_logits, teacher_logits, labels):
    keep = labels != -100
    kl = torch.nn.functional.kl_div(student_logits.log_softmax(-1), teacher_logits.log_softmax(-1),
                                    log_target=True, reduction="none").sum(-1)
    return (kl * keep).sum(), keep.sum()


class KDTrainer(Trainer):
    def __init__(self, *args, teacher=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = teacher

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs, num_items_in_batch=num_items_in_batch)
        with torch.no_grad():
            t = self.teacher(input_ids=inputs["input_ids"]).logits
        kl_sum, n = kl_and_count(out.logits, t, inputs["labels"])
        loss = 0.5 * out.loss + 0.5 * (kl_sum / n)  # expect: AG142
        return (loss, out) if return_outputs else loss


def run(model, teacher, ds):
    args = TrainingArguments(output_dir="o", per_device_train_batch_size=2,
                             gradient_accumulation_steps=4, report_to=[])
    KDTrainer(model=model, args=args, train_dataset=ds, teacher=teacher).train()
