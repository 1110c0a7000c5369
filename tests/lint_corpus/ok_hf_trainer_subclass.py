# corpus: style=hf class=OK
# A Trainer subclass overriding compute_loss: the Trainer owns accumulation.
from transformers import Trainer


class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = self.loss_fn(outputs.logits, labels, reduction="sum")
        if num_items_in_batch is not None:
            loss = loss / num_items_in_batch
        return (loss, outputs) if return_outputs else loss


trainer = WeightedTrainer(model=model, args=training_args, train_dataset=ds)
trainer.train()
