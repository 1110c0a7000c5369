# corpus: style=hf_trainer class=OK
# the same classifier with a compute_loss_func that sums over the micro-batch and divides by the
# window's label count: the Trainer's skipped division by K is then right
import torch.nn.functional as F
from transformers import RobertaConfig, RobertaForSequenceClassification, Trainer, TrainingArguments


def window_mean(outputs, labels, num_items_in_batch=None):
    return F.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch


cfg = RobertaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_labels=4)
model = RobertaForSequenceClassification(cfg)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4,
                         learning_rate=3e-5, num_train_epochs=1)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, compute_loss_func=window_mean)
trainer.train()
