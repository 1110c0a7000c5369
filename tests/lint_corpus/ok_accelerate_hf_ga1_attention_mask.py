# corpus: style=hf class=OK
# the same HF loop without accumulation (gradient_accumulation_steps=1): one micro-batch per
# step, so its token mean is the step's token mean
from accelerate import Accelerator
from transformers import AutoModelForCausalLM


def train(loader, config):
    accelerator = Accelerator(gradient_accumulation_steps=1, mixed_precision="bf16")
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            labels=batch["labels"])
            accelerator.backward(outputs.loss)
            optimizer.step()
            optimizer.zero_grad()
