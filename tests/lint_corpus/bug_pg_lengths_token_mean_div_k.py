# corpus: style=rl class=F5
# each micro-batch's token mean counts its tokens from the sequence lengths, then / K
import torch

accum_steps = 4
opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
for step, batch in enumerate(loader):
    logp, mask, lengths = policy(batch)
    loss = -(logp * batch["advantages"] * mask).sum() / lengths.sum()
    (loss / accum_steps).backward()  # expect: AG104
    if (step + 1) % accum_steps == 0:
        opt.step()
        opt.zero_grad()
