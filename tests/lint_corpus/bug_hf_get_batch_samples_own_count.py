# corpus: style=hf_trainer class=F6
# a Trainer subclass counts the window's label tokens itself and returns the count without
# gathering it over the processes
from transformers import Trainer, TrainingArguments


class CountingTrainer(Trainer):
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        n = sum((b["labels"] != -100).sum() for b in batches)
        return batches, n.to(device)  # expect: AG190


def main(model, data):
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
    CountingTrainer(model=model, args=args, train_dataset=data).train()
