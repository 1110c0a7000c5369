# corpus: style=hf class=F1
# TrainingArguments built with K = 4, then set_training() without it: K goes back to 1.
from transformers import Trainer, TrainingArguments


def train(model, dataset):
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4,
                             per_device_train_batch_size=8)
    args = args.set_training(learning_rate=2e-5, batch_size=8, num_epochs=3)  # expect: AG314
    Trainer(model=model, args=args, train_dataset=dataset).train()
