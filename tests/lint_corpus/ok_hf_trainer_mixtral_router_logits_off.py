# corpus: style=hf class=OK
# MoE with accumulation, router loss off (the default): the loss is the LM loss only,
# normalised over the window by num_items_in_batch
from transformers import MixtralConfig, MixtralForCausalLM, Trainer, TrainingArguments

config = MixtralConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, output_router_logits=False)
model = MixtralForCausalLM(config)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, gradient_accumulation_steps=8)
Trainer(model=model, args=args, train_dataset=train_ds).train()
