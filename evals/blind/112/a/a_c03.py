"""GRPO-style policy-gradient on spawned ranks without a DDP wrapper: a frozen
token embedding, group-normalised rewards, a token-level loss summed over
each window and divided by the response-token count of all ranks' windows;
gradients are summed over ranks by one flat all-reduce per update."""
import hashlib, os
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp

V, D, P, L, G, K, STEPS = 16, 32, 4, 8, 4, 2, 10
PORT = 49051


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.tok.weight.requires_grad_(False)  # frozen embedding table
        self.core = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, D))
        self.lm = nn.Linear(D, V)

    def forward(self, ids):  # bag-of-prefix model: causal cumulative mean
        h = self.tok(ids).cumsum(1) / torch.arange(1, ids.size(1) + 1)[None, :, None]
        return self.lm(h + self.core(h))


@torch.no_grad()
def rollout(policy, prompts, gen):
    ids = prompts.repeat_interleave(G, 0)
    for _ in range(L):
        probs = F.softmax(policy(ids)[:, -1], -1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], 1)
    resp = ids[:, P:]
    # reward: fraction of response tokens equal to the prompt's first token + 1
    target = (ids[:, :1] + 1) % V
    reward = (resp == target).float().mean(1)
    # variable-length responses: stop at the first token 0 (inclusive)
    stop = (resp == 0).float().cumsum(1)
    mask = ((stop - (resp == 0).float()) == 0).float()
    r = reward.view(-1, G)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    old = torch.gather(F.log_softmax(policy(ids[:, :-1]), -1), 2, ids[:, 1:, None]).squeeze(-1)[:, P - 1:]
    return ids, mask, adv, old


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    policy = Policy()
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3)
    gen = torch.Generator().manual_seed(17 + rank)
    for step in range(STEPS):
        window = [rollout(policy, torch.randint(1, V, (2, P), generator=gen), gen) for _ in range(K)]
        n_tok = torch.tensor(sum(float(w[1].sum()) for w in window))
        dist.all_reduce(n_tok)
        for ids, mask, adv, old in window:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = policy(ids[:, :-1])
            lp = torch.gather(F.log_softmax(logits.float(), -1), 2, ids[:, 1:, None]).squeeze(-1)[:, P - 1:]
            ratio = (lp - old).exp()
            pg = -torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
            ((pg * mask).sum() / n_tok).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)  # SUM: the divisor above already covers every rank
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p)); off += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} tokens {int(n_tok)}", flush=True)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
