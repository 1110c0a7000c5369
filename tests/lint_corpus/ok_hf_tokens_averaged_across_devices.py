# corpus: style=hf class=OK
from transformers import Trainer, TrainingArguments

args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, per_device_train_batch_size=2,
                         average_tokens_across_devices=True)
Trainer(model=model, args=args, train_dataset=dataset).train()
