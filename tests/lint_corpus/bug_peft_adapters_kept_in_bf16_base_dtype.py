# corpus: style=hf class=F12
# a bf16 base and PEFT told not to upcast its adapters: the only trainable parameters keep
# bf16 .grad, and the Trainer sums 8 micro-batches into them per update
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments


def load_model():
    config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=64, n_head=4)
    return AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)


model = get_peft_model(load_model(), LoraConfig(r=8, target_modules=["c_attn"]),
                       autocast_adapter_dtype=False)  # expect: AG364
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2,
                         gradient_accumulation_steps=8, bf16=True)
Trainer(model=model, args=args, train_dataset=train_ds).train()
