# corpus: style=hf class=OK
# TrainingArguments built with K = 4, and set_training() given K again.
from transformers import Trainer, TrainingArguments


def train(model, dataset):
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4,
                             per_device_train_batch_size=8)
    args = args.set_training(learning_rate=2e-5, batch_size=8, num_epochs=3,
                             gradient_accumulation_steps=4)
    Trainer(model=model, args=args, train_dataset=dataset).train()
