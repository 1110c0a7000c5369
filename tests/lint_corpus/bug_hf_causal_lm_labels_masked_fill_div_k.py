# corpus: style=hf_custom class=F5
# padded batches; the labels mask padding with -100 (masked_fill), so out.loss is a mean over
# this micro-batch's own label tokens, and the loop divides it by K: a mean of means
import torch
from transformers import AutoModelForCausalLM

ACCUM_STEPS = 4
model = AutoModelForCausalLM.from_pretrained("gpt2")
opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
for step, batch in enumerate(loader):
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    out = model(input_ids=batch["input_ids"], labels=labels)
    loss = out.loss / ACCUM_STEPS  # expect: AG104
    loss.backward()
    if (step + 1) % ACCUM_STEPS == 0:
        opt.step()
        opt.zero_grad()
