# corpus: style=ddp class=F10
# the world size is a module constant named only `W`: the summed loss is divided by the
# window's global token count and DDP then averages over the W ranks: G / W
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

W, K = 2, 4


def worker(rank, model, windows):
    dist.init_process_group("gloo", rank=rank, world_size=W)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for window in windows:
        n_tok = torch.tensor([float(sum((lab != -100).sum().item() for _, lab in window))])
        dist.all_reduce(n_tok)
        for k, (ids, labels) in enumerate(window):
            ctx = ddp.no_sync() if k < K - 1 else torch.enable_grad()
            with ctx:
                logits = ddp(ids)
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),  # expect: AG123
                                       ignore_index=-100, reduction="sum") / n_tok.item()
                loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    mp.spawn(worker, args=(None, []), nprocs=W)
