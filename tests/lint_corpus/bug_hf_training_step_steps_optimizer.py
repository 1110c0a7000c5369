# corpus: style=hf class=F1
from transformers import Trainer, TrainingArguments


class StepTrainer(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        self.accelerator.backward(loss)
        self.optimizer.step()  # expect: AG101
        self.optimizer.zero_grad()
        return loss.detach()


def main(model, ds):
    args = TrainingArguments(output_dir="x", gradient_accumulation_steps=4)
    StepTrainer(model=model, args=args, train_dataset=ds).train()
