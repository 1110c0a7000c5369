# corpus: style=hf class=LOSS_SCALE
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

PAD = 3


def pad_batch(rows):
    width = max(len(r) for r in rows)
    ids = [F.pad(r, (0, width - len(r)), value=PAD) for r in rows]
    return {"input_ids": ids, "labels": [i.clone() for i in ids]}


class SumTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        out = model(**inputs)
        logits = out.logits[:, :-1].flatten(0, 1)
        loss = F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=PAD,  # expect: AG379
                               reduction="sum") / num_items_in_batch
        return (loss, out) if return_outputs else loss


def main(model, ds):
    args = TrainingArguments("out", per_device_train_batch_size=4, gradient_accumulation_steps=4,
                             report_to=[])
    SumTrainer(model=model, args=args, train_dataset=ds, data_collator=pad_batch).train()
