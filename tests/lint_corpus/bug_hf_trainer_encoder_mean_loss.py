# corpus: style=hf_trainer class=LOSS_SCALE
# a tiny RoBERTa classifier under the stock Trainer with accumulation: its forward takes
# **kwargs, so the Trainer does not divide by K, and its loss is CrossEntropyLoss's mean
from transformers import RobertaConfig, RobertaForSequenceClassification, Trainer, TrainingArguments

cfg = RobertaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_labels=4)
model = RobertaForSequenceClassification(cfg)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4,
                         learning_rate=3e-5, num_train_epochs=1)
trainer = Trainer(model=model, args=args, train_dataset=train_ds)  # expect: AG155
trainer.train()
