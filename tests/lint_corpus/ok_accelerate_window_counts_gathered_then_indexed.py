# corpus: style=accelerate class=OK
# a pre-pass counts each window's tokens (a per-rank count reshaped by K), gathers them over
# the ranks, and each micro-step reads its window's global count by micro // K; the loss is
# then multiplied by K (accelerator.backward divides by K) and W (DDP averages)
import torch
from accelerate import Accelerator


def train(policy, opt, loader, k=3):
    acc = Accelerator(gradient_accumulation_steps=k)
    policy, opt, loader = acc.prepare(policy, opt, loader)
    K, W = acc.gradient_accumulation_steps, acc.num_processes
    local = torch.tensor([b["mask"].sum() for b in loader]).reshape(-1, K).sum(1)
    window_tokens = acc.gather(local[None]).sum(0)
    for micro, batch in enumerate(loader):
        n_tok = window_tokens[micro // K]
        with acc.accumulate(policy):
            per_token = -policy(batch["ids"]).log_softmax(-1).amax(-1) * batch["mask"]
            loss = per_token.sum() / n_tok * (K * W)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
