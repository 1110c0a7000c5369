# corpus: style=rl class=F5
# a masked-mean helper (one micro-batch's own response tokens), divided by the number of
# micro-batches: the right total weight, but short responses weigh more (mean of means)
import torch


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1)


def train(policy, optimizer, buffer, micro_batches_per_update=8):
    for update in range(100):
        for micro in range(micro_batches_per_update):
            batch = buffer.sample()
            logprobs = policy.logprobs(batch["tokens"])
            ratio = torch.exp(logprobs - batch["old_logprobs"])
            per_token_loss = -torch.min(ratio * batch["adv"], ratio.clamp(0.8, 1.2) * batch["adv"])
            pg_loss = masked_mean(per_token_loss, batch["response_mask"])
            (pg_loss / micro_batches_per_update).backward()  # expect: AG104
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
