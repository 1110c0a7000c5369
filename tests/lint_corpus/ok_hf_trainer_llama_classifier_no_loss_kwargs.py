# corpus: style=hf_trainer class=OK
# a tiny Llama sequence classifier under the stock Trainer with accumulation, told the model
# takes no loss kwargs: the Trainer divides each micro-batch's mean by K itself
from transformers import LlamaConfig, LlamaForSequenceClassification, Trainer, TrainingArguments

cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_labels=5, pad_token_id=0)
model = LlamaForSequenceClassification(cfg)
model.accepts_loss_kwargs = False
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, gradient_accumulation_steps=4)
trainer = Trainer(model=model, args=args, train_dataset=train_ds)
trainer.train()
