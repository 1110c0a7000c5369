# corpus: style=hf_custom class=OK
# a hand-written window over a HF causal LM: the window's label tokens are counted before the
# inner loop and passed as num_items_in_batch, so the model returns sum / window tokens and
# the K backwards add up to the window's token mean (nothing else divides by K)
import torch
from transformers import AutoModelForCausalLM

grad_accum_steps = 8
model = AutoModelForCausalLM.from_pretrained("gpt2")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
batches = iter(loader)
for step in range(num_steps):
    window = [next(batches) for _ in range(grad_accum_steps)]
    num_items = sum((b["labels"] != -100).sum() for b in window)
    for micro in range(grad_accum_steps):
        batch = window[micro]
        out = model(**batch, num_items_in_batch=num_items)
        out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
