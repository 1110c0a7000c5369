# corpus: style=hf_trainer class=F10
# the window's count reaches the division through a local name (None on a model without
# loss kwargs): still summed over every process, still never multiplied by them
import os

from transformers import Trainer


class MaskedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        target = inputs.pop("labels")
        out = model(**inputs)
        total, here = summed_ce(out.logits, target)
        norm = here if num_items_in_batch is None else num_items_in_batch
        loss = total / norm  # expect: AG143
        return (loss, out) if return_outputs else loss


if int(os.environ.get("LOCAL_RANK", 0)) == 0:
    print("training")
MaskedTrainer(model=net, args=training_args, train_dataset=rows).train()
