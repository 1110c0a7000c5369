# corpus: style=hf class=OK
# the same bf16 base with PEFT's default: the adapters are upcast to fp32 and their
# .grad sums each window in fp32
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments


def load_model():
    config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=64, n_head=4)
    return AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)


model = get_peft_model(load_model(), LoraConfig(r=8, target_modules=["c_attn"]),
                       autocast_adapter_dtype=True)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2,
                         gradient_accumulation_steps=8, bf16=True)
Trainer(model=model, args=args, train_dataset=train_ds).train()
