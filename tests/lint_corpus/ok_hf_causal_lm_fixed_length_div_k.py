# corpus: style=hf_custom class=OK
# packed fixed-length blocks, labels = input_ids (no padding, no -100): every micro-batch has
# the same token count, so out.loss / K is the window's mean
import torch
from transformers import AutoModelForCausalLM

ACCUM_STEPS = 4
model = AutoModelForCausalLM.from_pretrained("gpt2")
opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
for step, block in enumerate(packed_loader):
    out = model(input_ids=block, labels=block)
    loss = out.loss / ACCUM_STEPS
    loss.backward()
    if (step + 1) % ACCUM_STEPS == 0:
        opt.step()
        opt.zero_grad()
