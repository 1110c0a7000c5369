"""DPO on 2 DDP ranks with a frozen reference copy, two optimizers (AdamW on
the body, SGD on the output head), a variable number of preference pairs per
micro-batch, and a loss summed over pairs and divided by the window's pair
count over all ranks (times W, since DDP averages)."""
import copy, hashlib
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

V, D, T, K, STEPS, BETA = 40, 32, 12, 3, 12, 0.1


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.out = nn.Linear(D, V)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


def seq_logp(model, ids, mask):
    logits = model(ids[:, :-1])
    lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1)


def make_micro(step, micro, rank):
    g = torch.Generator().manual_seed(step * 1000 + micro * 10 + rank)
    n = int(torch.randint(1, 6, (1,), generator=g))  # 1..5 pairs
    ch = torch.randint(0, V, (n, T), generator=g)
    rj = torch.randint(0, V, (n, T), generator=g)
    ch[:, 1:] = (ch[:, :1] + torch.arange(1, T)) % V  # chosen: counting pattern
    mask = torch.ones(n, T)
    mask[:, :4] = 0  # prompt tokens
    rj[:, :4] = ch[:, :4]
    return ch, rj, mask


def main():
    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    policy = TinyLM()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    model = DDP(policy)
    body = [p for n, p in policy.named_parameters() if not n.startswith("out.")]
    opt_body = torch.optim.AdamW(body, lr=2e-3, weight_decay=0.0)
    opt_head = torch.optim.SGD(policy.out.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        window = [make_micro(step, m, rank) for m in range(K)]
        n_pairs = torch.tensor(float(sum(w[0].shape[0] for w in window)))
        dist.all_reduce(n_pairs)
        for m, (ch, rj, mask) in enumerate(window):
            ids = torch.cat([ch, rj])
            msk = torch.cat([mask, mask])
            ctx = model.no_sync() if m < K - 1 else torch.enable_grad()
            with ctx:
                lp = seq_logp(model, ids, msk)
                with torch.no_grad():
                    lr_ = seq_logp(ref, ids, msk)
                n = ch.shape[0]
                margin = (lp[:n] - lr_[:n]) - (lp[n:] - lr_[n:])
                loss = -F.logsigmoid(BETA * margin).sum() * W / n_pairs
                loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt_body.step(); opt_head.step()
        opt_body.zero_grad(); opt_head.zero_grad()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} pairs {int(n_pairs)} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
