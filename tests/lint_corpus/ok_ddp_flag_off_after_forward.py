# corpus: style=nanogpt class=OK
# The flag is turned OFF after the forward on every micro-step but the last. It acts one
# forward late, so the last micro-step's forward still sees True: every micro-step but the
# first syncs, the window's gradient is averaged. Correct, wasteful: a note.
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(GPT(config))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
grad_accum_steps = 8
for it in range(max_iters):
    for micro_step in range(grad_accum_steps):
        xb, yb = get_batch("train")
        _, loss = model(xb, yb)
        model.require_backward_grad_sync = micro_step != grad_accum_steps - 1  # expect: AG116
        (loss / grad_accum_steps).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
