# corpus: style=accelerate class=F10
# a second LoRA adapter is added after prepare() wrapped the model in DDP: its parameters
# are in no reducer, each rank trains its own copy
import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model

accelerator = Accelerator(gradient_accumulation_steps=4)
model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj"]), adapter_name="a")
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
model, opt, loader = accelerator.prepare(model, opt, loader)
inner = accelerator.unwrap_model(model)
inner.add_adapter("b", LoraConfig(r=8, target_modules=["v_proj"]))  # expect: AG346
inner.set_adapter("b")
opt = accelerator.prepare(torch.optim.AdamW([p for p in inner.parameters() if p.requires_grad]))
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
