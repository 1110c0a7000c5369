# corpus: style=hf_trainer class=LOSS_SCALE
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def soft_kl(student_logits, teacher_logits, temperature):
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


class KDTrainer(Trainer):
    def __init__(self, *args, teacher=None, weight=0.3, temperature=2.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher, self.weight, self.temperature = teacher, weight, temperature

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs, num_items_in_batch=num_items_in_batch)
        with torch.no_grad():
            teacher_logits = self.teacher(input_ids=inputs["input_ids"]).logits
        kd = soft_kl(out.logits, teacher_logits, self.temperature)
        loss = out.loss + self.weight * self.temperature ** 2 * kd  # expect: AG142
        return (loss, out) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=8, per_device_train_batch_size=2)
