# corpus: style=hf_trainer class=OK
# the same count gathered over the processes before it is returned, as the Trainer does
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
        n = self.accelerator.gather(n.to(device)).sum()
        return batches, n


def main(model, data):
    args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
    CountingTrainer(model=model, args=args, train_dataset=data).train()
