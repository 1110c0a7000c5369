# corpus: style=hf class=OK
# the same MoE setup without accumulation: one micro-batch per step, the router term weighs
# its coefficient once
from transformers import MixtralConfig, MixtralForCausalLM, Trainer, TrainingArguments

config = MixtralConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, output_router_logits=True)
model = MixtralForCausalLM(config)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=32, gradient_accumulation_steps=1)
Trainer(model=model, args=args, train_dataset=train_ds).train()
