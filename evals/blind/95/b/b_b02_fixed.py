"""CLIP-style dual encoder on FSDP2 (fully_shard per tower + root), learnable temperature in the criterion."""
import hashlib, os
from dataclasses import dataclass
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


@dataclass
class Cfg:
    img_dim: int = 24
    txt_dim: int = 20
    emb: int = 32
    micro_bs: int = 8
    accum: int = 3
    steps: int = 10
    lr: float = 5e-3


class Tower(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 64), nn.GELU(), nn.Linear(64, d_out))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


class DualEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.image = Tower(c.img_dim, c.emb)
        self.text = Tower(c.txt_dim, c.emb)

    def forward(self, img, txt):
        return self.image(img), self.text(txt)


class ClipLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, zi, zt):
        logits = self.logit_scale.exp() * zi @ zt.t()
        tgt = torch.arange(zi.shape[0])
        return 0.5 * (F.cross_entropy(logits, tgt) + F.cross_entropy(logits.t(), tgt))


def main():
    c = Cfg()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = DualEncoder(c)
    crit = ClipLoss()
    fully_shard(model.image, mesh=mesh)
    fully_shard(model.text, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(list(model.parameters()) + list(crit.parameters()), lr=c.lr, foreach=False)

    g = torch.Generator().manual_seed(7)
    n = c.steps * c.accum
    lat = torch.randn(n, world, c.micro_bs, 8, generator=g)
    A, B = torch.randn(8, c.img_dim, generator=g), torch.randn(8, c.txt_dim, generator=g)
    # the two data shards come from sources of different caption quality
    noise = torch.tensor([0.2, 1.5])[:world].view(1, world, 1, 1)
    imgs = lat @ A + 0.3 * torch.randn(n, world, c.micro_bs, c.img_dim, generator=g)
    txts = lat @ B + noise * torch.randn(n, world, c.micro_bs, c.txt_dim, generator=g)

    for step in range(c.steps):
        for k in range(c.accum):
            i = step * c.accum + k
            model.set_requires_gradient_sync(k == c.accum - 1)
            zi, zt = model(imgs[i, rank], txts[i, rank])
            loss = crit(zi, zt) / c.accum
            loss.backward()
        dist.all_reduce(crit.logit_scale.grad, op=dist.ReduceOp.SUM)
        crit.logit_scale.grad.div_(world)
        opt.step()
        opt.zero_grad(set_to_none=True)

    full = [p.full_tensor().detach().float().reshape(-1) for _, p in model.named_parameters()]
    full += [p.detach().float().reshape(-1) for _, p in crit.named_parameters()]
    if rank == 0:
        flat = torch.cat(full)
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
