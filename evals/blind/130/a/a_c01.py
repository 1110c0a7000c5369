"""DeepSpeed ZeRO-2 sequence classifier with an auxiliary reconstruction head.

The engine accumulates over 3 micro-batches (config), clips at 0.1, the token embedding
is frozen. The auxiliary head is called on the underlying module between the engine's
forward and backward.

    deepspeed --num_gpus 2 --master_port 49031 a_c01.py
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, D, N_CLS = 64, 12, 32, 4


class SeqClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.proj = nn.Linear(D, D)
        self.cls = nn.Linear(D, N_CLS)
        self.aux_head = nn.Linear(D, VOCAB)  # predicts the bag of tokens from the summary

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        summary = torch.tanh(self.proj(h.mean(1)))
        return self.cls(summary), summary


def synthetic_batches(rank, n, bs, seed=7):
    g = torch.Generator().manual_seed(seed * 31 + rank)
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (bs, SEQ), generator=g)
        y = (ids[:, 0] + ids[:, -1]) % N_CLS
        yield ids, y


def build_model(seed):
    torch.manual_seed(seed)
    model = SeqClassifier()
    model.embed.weight.requires_grad_(False)
    return model


def losses(model_out, aux_logits, ids, y, aux_weight):
    logits, _ = model_out
    bag = torch.zeros(ids.shape[0], VOCAB).scatter_(1, ids, 1.0)
    ce = F.cross_entropy(logits, y)
    aux = F.binary_cross_entropy_with_logits(aux_logits, bag)
    return ce + aux_weight * aux


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro", type=int, default=6)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--clip", type=float, default=0.1)
    p.add_argument("--aux-weight", type=float, default=0.3)
    args = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()

    model = build_model(seed=5)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=2e-3, weight_decay=0.01)
    cfg = {
        "train_micro_batch_size_per_gpu": args.micro,
        "gradient_accumulation_steps": args.accum,
        "gradient_clipping": args.clip,
        "zero_optimization": {"stage": 2, "overlap_comm": False},
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, model_parameters=trainable, config=cfg)

    for i, (ids, y) in enumerate(synthetic_batches(rank, args.steps * args.accum, args.micro)):
        out = engine(ids)
        aux_logits = engine.module.aux_head(out[1])
        loss = losses(out, aux_logits, ids, y, args.aux_weight)
        engine.backward(loss)
        engine.step()
        if rank == 0 and engine.is_gradient_accumulation_boundary() is False and i % 9 == 8:
            print(f"micro {i} loss {loss.item():.4f} steps {engine.global_steps}", flush=True)

    h = hashlib.sha256()
    for _, prm in engine.module.named_parameters():
        h.update(prm.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
