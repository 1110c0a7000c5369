# corpus: style=nanogpt class=F11
# the sync flag compares the micro-step with K itself: range(K) stops at K - 1, so no
# micro-step is all-reduced and each rank steps on its own gradient
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, get_batch, max_iters, gradient_accumulation_steps=4):
    model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4)
    for _ in range(max_iters):
        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps)  # expect: AG111
            X, Y = get_batch()
            _, loss = model(X, Y)
            (loss / gradient_accumulation_steps).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
