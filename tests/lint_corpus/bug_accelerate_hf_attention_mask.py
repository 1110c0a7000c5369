# corpus: style=hf class=F5
# an HF causal LM on padded batches (attention_mask, labels -100 on padding): outputs.loss is a
# per-micro-batch token mean, and accelerator.backward divides it by K
from accelerate import Accelerator
from transformers import AutoModelForCausalLM


def train(loader, config):
    accelerator = Accelerator(gradient_accumulation_steps=4, mixed_precision="bf16")
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            labels=batch["labels"])
            accelerator.backward(outputs.loss)  # expect: AG104
            optimizer.step()
            optimizer.zero_grad()
