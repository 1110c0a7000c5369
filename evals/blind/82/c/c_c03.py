"""DPO on a tiny GRU language model whose vocabulary was extended with two new special
tokens, on 2 ranks (torchrun) with data parallelism written by hand.

- the embedding is resized from 40 to 42 rows before training; the pretrained rows are
  frozen by a gradient mask, only the two new rows (and the rest of the model) learn;
- two optimizers: SGD with momentum for the embedding, AdamW for everything else;
- a padding collate runs in a DataLoader worker process;
- each rank holds 42 pairs, micro-batches of 4 pairs, so every epoch ends with a
  2-pair micro-batch inside a 3-micro-batch window: the summed DPO loss of a window is
  divided by the number of pairs in that window over all ranks (counted before the
  window's first backward), and the gradients are summed over the ranks once per window.
"""
import argparse
import copy
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

BASE_VOCAB, PAD, SEP, EOS = 40, 0, 40, 41


class PairSet(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            plen = int(torch.randint(3, 7, (1,), generator=g))
            prompt = torch.randint(1, BASE_VOCAB, (plen,), generator=g)
            chosen = prompt.flip(0)[: int(torch.randint(2, plen + 1, (1,), generator=g))]
            rejected = torch.randint(1, BASE_VOCAB, (int(torch.randint(2, 7, (1,), generator=g)),),
                                     generator=g)
            self.items.append((prompt, chosen, rejected))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def build_seq(prompt, resp):
    seq = torch.cat([prompt, torch.tensor([SEP]), resp, torch.tensor([EOS])])
    mask = torch.zeros(len(seq), dtype=torch.bool)
    mask[len(prompt) + 1:] = True          # response tokens and EOS are scored
    return seq, mask


def collate(batch):
    seqs, masks = [], []
    for prompt, chosen, rejected in batch:
        for resp in (chosen, rejected):
            s, m = build_seq(prompt, resp)
            seqs.append(s)
            masks.append(m)
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), PAD)
    msk = torch.zeros(len(seqs), L, dtype=torch.bool)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = s
        msk[i, : len(m)] = m
    return ids, msk                         # rows: chosen0, rejected0, chosen1, ...


class GRULM(nn.Module):
    def __init__(self, vocab, dim=48):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        return self.lm_head(h)


def resize_token_embeddings(model, new_vocab):
    old_emb, old_head = model.embed, model.lm_head
    n_old, dim = old_emb.weight.shape
    model.embed = nn.Embedding(new_vocab, dim)
    model.lm_head = nn.Linear(dim, new_vocab)
    with torch.no_grad():
        model.embed.weight[:n_old] = old_emb.weight
        model.embed.weight[n_old:] = old_emb.weight.mean(0)
        model.lm_head.weight[:n_old] = old_head.weight
        model.lm_head.weight[n_old:] = old_head.weight.mean(0)
        model.lm_head.bias[:n_old] = old_head.bias
        model.lm_head.bias[n_old:] = old_head.bias.mean()
    return n_old


def seq_logps(model, ids, mask):
    logits = model(ids[:, :-1])
    lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1)


def dpo_loss_sum(policy, ref, ids, mask, beta):
    pl = seq_logps(policy, ids, mask)
    with torch.no_grad():
        rl = seq_logps(ref, ids, mask)
    margin = (pl[0::2] - rl[0::2]) - (pl[1::2] - rl[1::2])
    return -F.logsigmoid(beta * margin).sum()


def windows(loader, k):
    buf = []
    for batch in loader:
        buf.append(batch)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--beta", type=float, default=0.2)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    policy = GRULM(BASE_VOCAB)                       # stands in for a pretrained base
    n_old = resize_token_embeddings(policy, BASE_VOCAB + 2)
    ref = copy.deepcopy(policy).eval().requires_grad_(False)

    row_mask = torch.zeros(BASE_VOCAB + 2, 1)
    row_mask[n_old:] = 1.0
    policy.embed.weight.register_hook(lambda g: g * row_mask)

    emb_opt = torch.optim.SGD([policy.embed.weight], lr=0.5, momentum=0.9)
    rest = [p for n, p in policy.named_parameters() if not n.startswith("embed.")]
    main_opt = torch.optim.AdamW(rest, lr=3e-3, weight_decay=0.0)
    optimizers = (emb_opt, main_opt)
    params = [p for p in policy.parameters() if p.requires_grad]

    ds = PairSet(84, args.seed)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=collate,
                        num_workers=1, persistent_workers=True)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for window in windows(loader, args.accum):
            n_pairs = torch.tensor(float(sum(ids.size(0) // 2 for ids, _ in window)))
            dist.all_reduce(n_pairs)
            for ids, mask in window:
                loss = dpo_loss_sum(policy, ref, ids, mask, args.beta) / n_pairs
                loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)               # sum over ranks: the loss is already / all pairs
            off = 0
            for p in params:
                p.grad.copy_(flat[off: off + p.numel()].view_as(p))
                off += p.numel()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} window pairs {int(n_pairs)} last loss {loss.item():.4f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in policy.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
