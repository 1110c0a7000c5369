# corpus: style=hf class=OK
# the model normalises its loss by the window's token count when given num_items_in_batch
from transformers import Trainer, TrainingArguments


class AuxTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        loss = outputs.loss
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
AuxTrainer(model=model, args=args, train_dataset=ds).train()
