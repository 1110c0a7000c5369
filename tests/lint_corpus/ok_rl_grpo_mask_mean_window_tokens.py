# corpus: style=rl class=OK
# GRPO-style update normalised by the window's completion tokens, counted before the first
# backward: every token weighs 1 / N over the whole optimizer step
import torch


def grpo_update(policy, opt, chunks, grad_accum_steps=4):
    window_tokens = sum(c["mask"][:, 1:].sum() for c in chunks[:grad_accum_steps])
    for k in range(grad_accum_steps):
        ids, adv, m = chunks[k]["ids"], chunks[k]["adv"], chunks[k]["mask"][:, 1:]
        logp = torch.log_softmax(policy(ids[:, :-1]), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(adv[:, None] * logp * m).sum() / window_tokens
        loss.backward()
    opt.step()
    opt.zero_grad()
