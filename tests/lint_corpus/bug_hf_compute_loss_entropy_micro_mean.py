# corpus: style=hf class=LOSS_SCALE
# a confidence penalty subtracted beside the model's CE (normalised by num_items_in_batch):
# the entropy is a mean over this micro-batch's own tokens, so it weighs K times its beta
from transformers import Trainer, TrainingArguments


class EntropyTrainer(Trainer):
    beta = 0.1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        logp = outputs.logits.log_softmax(-1)
        valid = inputs["labels"] != -100
        ent_sum = (-(logp.exp() * logp).sum(-1) * valid).sum()
        entropy = ent_sum / valid.sum()
        loss = outputs.loss - self.beta * entropy  # expect: AG142
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
EntropyTrainer(model=model, args=args, train_dataset=ds).train()
