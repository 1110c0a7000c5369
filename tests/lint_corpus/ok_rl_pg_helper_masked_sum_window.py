# corpus: style=rl class=OK
# a masked-sum helper divided by the response tokens of the whole update, counted once
# before the micro-batches run: every token weighs 1 / N
import torch


def masked_sum(values, mask):
    return (values * mask).sum()


def train(policy, optimizer, buffer, micro_batches_per_update=8):
    for update in range(100):
        batches = [buffer.sample() for _ in range(micro_batches_per_update)]
        total_tokens = sum(int(b["response_mask"].sum()) for b in batches)
        for batch in batches:
            logprobs = policy.logprobs(batch["tokens"])
            per_token_loss = -(logprobs - batch["old_logprobs"]).exp() * batch["adv"]
            pg_loss = masked_sum(per_token_loss, batch["response_mask"]) / total_tokens
            pg_loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
