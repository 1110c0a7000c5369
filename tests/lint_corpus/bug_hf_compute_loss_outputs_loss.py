# corpus: style=hf class=F5
# compute_loss adds a regulariser to the model's own loss, computed without num_items_in_batch:
# a mean over this micro-batch's tokens
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


class RegularisedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = outputs.loss + 1e-4 * sum(p.pow(2).sum() for p in model.lm_head.parameters())  # expect: AG118
        return (loss, outputs) if return_outputs else loss


model = AutoModelForCausalLM.from_config(config)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, gradient_accumulation_steps=8)
RegularisedTrainer(model=model, args=args, train_dataset=ds, data_collator=collator).train()
