# corpus: style=nanogpt class=OK
# the same split, tokens per iteration over every rank
import os

ddp_world_size = int(os.environ["WORLD_SIZE"])
gradient_accumulation_steps = 8
gradient_accumulation_steps //= ddp_world_size
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
lr_decay_iters = decay_tokens // tokens_per_iter
