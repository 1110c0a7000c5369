# corpus: style=accelerate class=OK
# each rank takes its window as a slice of its shard (bounds in K, its shard a slice by
# W); the window's completion-token count is gathered over ranks, and the summed loss is
# multiplied by K (accelerator.backward divides by K) and W (DDP averages): neither a
# division by K nor by W
import torch
from accelerate import Accelerator


def train(policy, opt, rollouts, n_windows, grad_accum=2):
    accelerator = Accelerator(gradient_accumulation_steps=grad_accum)
    W = accelerator.num_processes
    policy, opt = accelerator.prepare(policy, opt)
    mine = rollouts[accelerator.process_index::W]
    for w in range(n_windows):
        window = mine[w * grad_accum:(w + 1) * grad_accum]
        n_tokens = accelerator.gather(sum(b["mask"].sum() for b in window).reshape(1)).sum()
        for batch in window:
            with accelerator.accumulate(policy):
                per_token = -policy(batch["ids"]).log_softmax(-1).amax(-1) * batch["mask"]
                loss = per_token.sum() / n_tokens * grad_accum * W
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
