# corpus: style=hf_trainer class=OK
# the same override handing the count on by keyword
from transformers import Trainer, TrainingArguments


class NoisyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = self.add_noise(inputs)
        return super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=8)
NoisyTrainer(model=model, args=args, train_dataset=ds).train()
