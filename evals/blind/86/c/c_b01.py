# MAE/BEiT-style fine-tuning loop (timm conventions): engine_finetune.train_one_epoch with a
# NativeScalerWithGradNormCount loss scaler, fp16 autocast, per-iteration half-cycle cosine LR.
import argparse, hashlib, math, os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args_parser():
    p = argparse.ArgumentParser("tiny ViT fine-tune", add_help=False)
    p.add_argument("--batch_size", default=8, type=int)
    p.add_argument("--epochs", default=3, type=int)
    p.add_argument("--accum_iter", default=4, type=int)
    p.add_argument("--blr", default=2e-3, type=float)
    p.add_argument("--min_lr", default=1e-5, type=float)
    p.add_argument("--warmup_epochs", default=1, type=int)
    p.add_argument("--weight_decay", default=0.05, type=float)
    p.add_argument("--clip_grad", default=1.0, type=float)
    p.add_argument("--smoothing", default=0.1, type=float)
    p.add_argument("--seed", default=0, type=int)
    p.add_argument("--num_samples", default=320, type=int)
    return p


# ---------------------------------------------------------------- util/misc.py
def get_grad_norm_(parameters, norm_type: float = 2.0) -> torch.Tensor:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = [p for p in parameters if p.grad is not None]
    if len(parameters) == 0:
        return torch.tensor(0.0)
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type) for p in parameters]), norm_type)


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if update_grad:
            if clip_grad is not None:
                assert parameters is not None
                self._scaler.unscale_(optimizer)  # unscale the gradients of optimizer's assigned params in-place
                norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            else:
                self._scaler.unscale_(optimizer)
                norm = get_grad_norm_(parameters)
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            norm = None
        return norm

    def state_dict(self):
        return self._scaler.state_dict()


# ---------------------------------------------------------------- util/lr_sched.py
def adjust_learning_rate(optimizer, epoch, args):
    """Decay the learning rate with half-cycle cosine after warmup"""
    if epoch < args.warmup_epochs:
        lr = args.lr * epoch / args.warmup_epochs
    else:
        lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (
            1.0 + math.cos(math.pi * (epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs)))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr * param_group.get("lr_scale", 1.0)
    return lr


# ---------------------------------------------------------------- models_vit.py (tiny)
class TinyViT(nn.Module):
    def __init__(self, patch=4, img=16, dim=32, depth=2, heads=4, num_classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        n = (img // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.fc_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        x = self.blocks(x)
        return self.head(self.fc_norm(x[:, 1:].mean(1)))


# ---------------------------------------------------------------- engine_finetune.py
def train_one_epoch(model, criterion, data_loader, optimizer, epoch, loss_scaler, args):
    model.train(True)
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    for data_iter_step, (samples, targets) in enumerate(data_loader):
        # we use a per iteration (instead of per epoch) lr scheduler
        if data_iter_step % accum_iter == 0:
            adjust_learning_rate(optimizer, data_iter_step / len(data_loader) + epoch, args)

        with torch.autocast("cpu", dtype=torch.float16):
            outputs = model(samples)
            loss = criterion(outputs.float(), targets)

        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise SystemExit(f"Loss is {loss_value}, stopping training")

        loss /= accum_iter
        loss_scaler(loss, optimizer, clip_grad=args.clip_grad,
                    parameters=model.parameters(), create_graph=False)
        if (data_iter_step + 1) % accum_iter == 0:
            optimizer.zero_grad()


def main(args):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    g = torch.Generator().manual_seed(1234)
    images = torch.randn(args.num_samples, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (args.num_samples,), generator=g)
    dataset_train = TensorDataset(images, labels)
    sampler_train = DistributedSampler(dataset_train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size, drop_last=True)

    model = TinyViT()
    model_without_ddp = model
    model = DDP(model)

    eff_batch_size = args.batch_size * args.accum_iter * world
    args.lr = args.blr * eff_batch_size / 256

    decay = [p for n, p in model_without_ddp.named_parameters() if p.ndim > 1 and "token" not in n and "pos_embed" not in n]
    no_decay = [p for n, p in model_without_ddp.named_parameters() if not (p.ndim > 1 and "token" not in n and "pos_embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    loss_scaler = NativeScalerWithGradNormCount()
    criterion = nn.CrossEntropyLoss(label_smoothing=args.smoothing)

    for epoch in range(args.epochs):
        sampler_train.set_epoch(epoch)
        train_one_epoch(model, criterion, data_loader_train, optimizer, epoch, loss_scaler, args)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model_without_ddp.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model_without_ddp.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    main(args)
