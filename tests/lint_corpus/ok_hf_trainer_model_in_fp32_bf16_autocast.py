# corpus: style=hf class=OK
# the model is built in fp32: bf16=True computes in bf16 and keeps fp32 weights and .grad
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

DTYPE = torch.float32
model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_layer=2), dtype=DTYPE)
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=8, bf16=True)
Trainer(model=model, args=args, train_dataset=ds).train()
