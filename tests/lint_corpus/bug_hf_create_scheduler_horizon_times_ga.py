# corpus: style=hf_trainer class=F4
from transformers import Trainer, TrainingArguments
from transformers.optimization import get_linear_schedule_with_warmup


class RecipeTrainer(Trainer):
    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None:
            steps = num_training_steps * self.args.gradient_accumulation_steps
            self.lr_scheduler = get_linear_schedule_with_warmup(  # expect: AG198
                optimizer or self.optimizer, num_warmup_steps=10, num_training_steps=steps)
        return self.lr_scheduler


def main(model, train_ds):
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                             gradient_accumulation_steps=8, max_steps=100)
    RecipeTrainer(model=model, args=args, train_dataset=train_ds).train()
