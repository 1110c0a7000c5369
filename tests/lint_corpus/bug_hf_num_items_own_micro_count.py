# corpus: style=hf_custom class=LOSS_SCALE
# num_items_in_batch is counted inside the inner loop from this micro-batch alone: the model
# returns this micro-batch's token mean, backwarded as is K times, nothing divides by K
import torch
from transformers import AutoModelForCausalLM

ACCUM = 4
model = AutoModelForCausalLM.from_pretrained("gpt2")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
it = iter(loader)
for step in range(num_steps):
    for micro in range(ACCUM):
        batch = next(it)
        n_tok = (batch["labels"] != -100).sum()
        out = model(**batch, num_items_in_batch=n_tok)
        out.loss.backward()  # expect: AG122
    optimizer.step()
    optimizer.zero_grad()
