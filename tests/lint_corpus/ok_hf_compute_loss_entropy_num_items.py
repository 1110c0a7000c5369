# corpus: style=hf class=OK
# the same penalty normalised by the window's token count (num_items_in_batch), like the CE
from transformers import Trainer, TrainingArguments


class EntropyTrainer(Trainer):
    beta = 0.1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        logp = outputs.logits.log_softmax(-1)
        valid = inputs["labels"] != -100
        ent_sum = (-(logp.exp() * logp).sum(-1) * valid).sum()
        entropy = ent_sum / num_items_in_batch
        loss = outputs.loss - self.beta * entropy
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
EntropyTrainer(model=model, args=args, train_dataset=ds).train()
