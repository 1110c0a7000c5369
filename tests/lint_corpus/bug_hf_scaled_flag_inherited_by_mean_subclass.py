# corpus: style=hf class=LOSS_SCALE
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class WindowTokenTrainer(Trainer):
    """The shared base: a summed token loss over the window's count."""
    loss_is_scaled_for_ga = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs)
        return out.logits.sum() / num_items_in_batch


class RewardTrainer(WindowTokenTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        target = inputs.pop("target")
        out = model(**inputs)
        return F.smooth_l1_loss(out.logits.squeeze(-1), target)  # expect: AG118, AG174


def main(model, ds):
    args = TrainingArguments("out", per_device_train_batch_size=8, gradient_accumulation_steps=2,
                             report_to=[])
    RewardTrainer(model=model, args=args, train_dataset=ds).train()
