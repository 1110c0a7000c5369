# corpus: style=hf_trainer class=LOSS_SCALE
# a tiny Llama sequence classifier under the stock Trainer with accumulation: its shared head's
# forward takes **kwargs (so the Trainer does not divide by K) and calls the library's loss
# without the count: each micro-batch's mean reaches the gradient undivided
from transformers import LlamaConfig, LlamaForSequenceClassification, Trainer, TrainingArguments

cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_labels=5, pad_token_id=0)
model = LlamaForSequenceClassification(cfg)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, gradient_accumulation_steps=4)
trainer = Trainer(model=model, args=args, train_dataset=train_ds)  # expect: AG155
trainer.train()
