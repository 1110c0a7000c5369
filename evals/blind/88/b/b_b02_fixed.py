"""DeepSpeed ZeRO-3 engine: masked next-token objective over variable-length
sequences. Each window's loss is normalised by the number of valid target
tokens in the window; the engine owns gradient accumulation."""
import argparse
import hashlib
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

IGNORE = -100


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--dim", type=int, default=48)
    p.add_argument("--seq", type=int, default=24)
    p.add_argument("--micro_bs", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    return p.parse_args()


class GRULM(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.proj = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Tanh())
        self.out = nn.Linear(dim, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(self.proj(h))


def synthetic_shard(args, rank):
    """Rank-local shard; rank 1 holds longer documents than rank 0."""
    g = torch.Generator().manual_seed(77 + rank)
    n = args.steps * args.grad_accum * args.micro_bs
    ids = torch.randint(1, args.vocab, (n, args.seq + 1), generator=g)
    lo, hi = (3, 10) if rank == 0 else (10, args.seq + 1)
    lens = torch.randint(lo, hi, (n,), generator=g)
    labels = ids[:, 1:].clone()
    pos = torch.arange(args.seq).unsqueeze(0)
    labels[pos >= lens.unsqueeze(1)] = IGNORE
    return list(zip(ids[:, :-1].split(args.micro_bs), labels.split(args.micro_bs)))


def window_token_count(window):
    return sum(int((y != IGNORE).sum()) for _, y in window)


def main():
    args = parse()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)

    model = GRULM(args.vocab, args.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_bs,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)

    data = synthetic_shard(args, rank)
    K = args.grad_accum
    for step in range(args.steps):
        window = data[step * K:(step + 1) * K]
        n_tok = torch.tensor(float(window_token_count(window)))
        dist.all_reduce(n_tok)
        n_tok = int(n_tok.item())
        for x, y in window:
            logits = engine(x)
            tok_sum = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1),
                                      ignore_index=IGNORE, reduction="sum")
            # engine.backward divides by GA and the ranks' average by W; undo both
            loss = tok_sum * K * world / n_tok
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"step {step} tokens {n_tok} loss {loss.item() / K:.4f}", flush=True)

    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        fulls = [(n, p.detach().float().clone()) for n, p in engine.module.named_parameters()]
    if rank == 0:
        h = hashlib.sha256()
        for _, t in fulls:
            h.update(t.contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
