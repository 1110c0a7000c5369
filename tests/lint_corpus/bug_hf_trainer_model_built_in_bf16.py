# corpus: style=hf class=F12
# the model is built in bf16 for the Trainer: bf16=True is autocast only, so the .grad the
# Trainer sums 8 micro-batches into is bf16
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

DTYPE = torch.bfloat16
model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_layer=2), dtype=DTYPE)
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=8, bf16=True)
Trainer(model=model, args=args, train_dataset=ds).train()  # expect: AG372
