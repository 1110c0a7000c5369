# ZeRO-1 from a JSON config file: two parameter groups, a frozen embedding table,
# a client warm-up schedule stepped by the engine, clipping, and a save/reload into a
# freshly built engine halfway through.
import argparse, hashlib, json, os, tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed

ap = argparse.ArgumentParser()
ap.add_argument("--local_rank", type=int, default=-1)
ap.add_argument("--total_updates", type=int, default=12)
ap.add_argument("--resume_at", type=int, default=6)
args = ap.parse_args()

MICRO, GA, VOCAB, DIM, SEQ = 4, 3, 50, 24, 10
deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()

CKPT = "/tmp/wb87_b_c01_ckpt"
CFG_PATH = "/tmp/wb87_b_c01_ds.json"
if rank == 0:
    with open(CFG_PATH, "w") as f:
        json.dump({
            "train_batch_size": MICRO * GA * world,
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_clipping": 0.5,
            "zero_optimization": {"stage": 1},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 100000,
        }, f)
dist.barrier()


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.emb.weight.requires_grad_(False)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.cls = nn.Linear(DIM, 6)

    def forward(self, tok, lab):
        h, _ = self.rnn(self.emb(tok))
        logits = self.cls(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, 6), lab.reshape(-1))


def build():
    torch.manual_seed(0)
    m = Tagger()
    decay = [p for n, p in m.named_parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for n, p in m.named_parameters() if p.requires_grad and p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=4e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    eng, _, _, sch = deepspeed.initialize(model=m, optimizer=opt, lr_scheduler=sched, config=CFG_PATH)
    return eng


def micro_batch(update, k):
    g = torch.Generator().manual_seed(10_000 * update + 100 * k + rank)
    tok = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    lab = (tok * 7 + torch.roll(tok, 1, dims=1)) % 6
    return tok, lab


def run(engine, start, stop):
    for u in range(start, stop):
        for k in range(GA):
            tok, lab = micro_batch(u, k)
            loss = engine(tok, lab)
            engine.backward(loss)
            engine.step()


engine = build()
run(engine, 0, args.resume_at)
engine.save_checkpoint(CKPT, tag="mid")
del engine

engine = build()
engine.load_checkpoint(CKPT, tag="mid")
assert engine.global_steps == args.resume_at
run(engine, engine.global_steps, args.total_updates)

buf = b"".join(p.detach().float().cpu().numpy().tobytes() for _, p in engine.module.named_parameters())
if rank == 0:
    print("FINAL_SHA256", hashlib.sha256(buf).hexdigest(), flush=True)
dist.barrier()
