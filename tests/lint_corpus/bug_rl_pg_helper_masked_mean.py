# corpus: style=rl class=LOSS_SCALE
# policy-gradient loss through a masked_mean helper (one micro-batch's tokens), clamp on
# the count, a while loop over the micro-batches of one update
import torch


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1)


def train(policy, optimizer, buffer, micro_batches_per_update=8):
    for update in range(100):
        micro = 0
        while micro < micro_batches_per_update:
            batch = buffer.sample()
            logprobs = policy.logprobs(batch["tokens"])
            ratio = torch.exp(logprobs - batch["old_logprobs"])
            per_token_loss = -torch.min(ratio * batch["adv"], ratio.clamp(0.8, 1.2) * batch["adv"])
            pg_loss = masked_mean(per_token_loss, batch["response_mask"])
            pg_loss.backward()  # expect: AG129
            micro += 1
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
