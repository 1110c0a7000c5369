# corpus: style=hf_trainer class=F5
# a Trainer subclass augments its inputs and calls the parent without the window's token count
from transformers import Trainer, TrainingArguments


class NoisyTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = self.add_noise(inputs)
        return super().training_step(model, inputs)  # expect: AG304


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=8)
NoisyTrainer(model=model, args=args, train_dataset=ds).train()
