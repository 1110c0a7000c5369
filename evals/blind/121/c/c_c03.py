"""REINFORCE-style fine-tuning of a tiny GRU policy on spawned DDP ranks (no launcher).

Each update samples a buffer of 8 micro-batches of responses with uneven lengths per rank,
consumed in windows of K = 3 micro-batches (3-3-2: the last window is short). The loss of a
window is the sum of per-token policy-gradient terms over the window's all-ranks response
token count, times the world size, so DDP's average gives the token mean of the window.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, MAXLEN, MB = 16, 24, 6, 4
K, BUFFER_MICRO, ROLLOUTS, SEED = 3, 8, 3, 21
PORT = 49209


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.lm = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.lm(h)


@torch.no_grad()
def sample_buffer(policy, rank, rollout):
    g = torch.Generator().manual_seed(SEED * 100 + rollout * 10 + rank)
    buf = []
    for _ in range(BUFFER_MICRO):
        tokens = torch.zeros(MB, MAXLEN + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(1, VOCAB, (MB,), generator=g)
        for t in range(MAXLEN):
            probs = F.softmax(policy(tokens[:, : t + 1])[:, -1], -1)
            tokens[:, t + 1] = torch.multinomial(probs, 1, generator=g).squeeze(1)
        lengths = torch.randint(1, MAXLEN + 1, (MB,), generator=g)
        mask = (torch.arange(MAXLEN)[None] < lengths[:, None]).float()
        reward = ((tokens[:, 1:] % 3 == 0).float() * mask).sum(1) / lengths
        adv = reward - reward.mean()
        buf.append((tokens, mask, adv))
    return buf


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(SEED)
    net = Policy()
    model = DDP(net)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)

    for rollout in range(ROLLOUTS):
        buf = sample_buffer(net, rank, rollout)
        windows = [buf[i:i + K] for i in range(0, len(buf), K)]
        for window in windows:
            n_tok = torch.tensor(sum(float(m.sum()) for _, m, _ in window))
            dist.all_reduce(n_tok)
            for j, (tokens, mask, adv) in enumerate(window):
                model.require_backward_grad_sync = j == len(window) - 1
                logp = F.log_softmax(model(tokens[:, :-1]), -1)
                lp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
                loss = -(lp * adv[:, None] * mask).sum() / n_tok * world
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
