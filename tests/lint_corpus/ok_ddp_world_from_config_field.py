# corpus: style=ddp class=OK
# the world size is a config field given to init_process_group (`world_size=cfg.W`) and read
# through another name of the same config (`c.W`): the loss over the all-reduced window count
# times W undoes DDP's average
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, cfg, rank):
        self.cfg, self.rank = cfg, rank
        self.model = DDP(make_model())

    def step(self, window):
        c = self.cfg
        ntok = count_tokens(window)
        dist.all_reduce(ntok)
        for k, (x, t) in enumerate(window):
            if k < c.K - 1:
                with self.model.no_sync():
                    (tok_loss_sum(self.model, x, t) * c.W / ntok).backward()
            else:
                (tok_loss_sum(self.model, x, t) * c.W / ntok).backward()
        self.opt.step()
        self.opt.zero_grad()


def worker(rank, cfg):
    dist.init_process_group("gloo", rank=rank, world_size=cfg.W)
    trainer = Trainer(cfg, rank)
    for window in windows(cfg, rank):
        trainer.step(window)
