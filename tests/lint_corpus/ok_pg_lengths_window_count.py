# corpus: style=rl class=OK
# the token count of the whole window, from the lengths, before its micro-batches run
import torch

accum_steps = 4
opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
for step in range(num_steps):
    window = [next(batches) for _ in range(accum_steps)]
    window_tokens = sum(int(b["lengths"].sum()) for b in window)
    for b in window:
        logp, mask, lengths = policy(b)
        loss = -(logp * b["advantages"] * mask).sum() / window_tokens
        loss.backward()
    opt.step()
    opt.zero_grad()
