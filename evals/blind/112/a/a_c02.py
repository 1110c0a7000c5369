"""Self-distillation (mean teacher) on 2 DDP ranks: the teacher is an EMA of the
student updated once per optimizer step; a worker DataLoader with 10
micro-batches per rank per epoch at K = 4 gives 4-4-2 windows, each divided by
its own length; training stops after epoch 1, is reloaded into new objects
from a checkpoint, and finishes epoch 2."""
import copy, hashlib, os, tempfile
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

K, MB, EPOCHS, EMA = 4, 6, 3, 0.95


def build(rank, world):
    torch.manual_seed(3)
    student = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Dropout(0.0), nn.Linear(48, 4))
    teacher = copy.deepcopy(student).requires_grad_(False)
    model = DDP(student)
    opt = torch.optim.AdamW(student.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
    return student, teacher, model, opt, sched


def epoch_loader(ds, rank, world, epoch):
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=5)
    sampler.set_epoch(epoch)
    return DataLoader(ds, batch_size=MB, sampler=sampler, num_workers=1, drop_last=True)


def run_epoch(epoch, ds, rank, world, student, teacher, model, opt, sched):
    loader = epoch_loader(ds, rank, world, epoch)
    n = len(loader)  # 10 micro-batches per rank
    for i, (x, y) in enumerate(loader):
        w0 = (i // K) * K
        win = min(K, n - w0)  # 4, 4, 2
        last = i == w0 + win - 1
        ctx = model.no_sync() if not last else torch.enable_grad()
        with ctx:
            s = model(x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(i + 100 * epoch + 7 * rank)))
            with torch.no_grad():
                t = teacher(x)
            loss = F.cross_entropy(s, y) + 0.5 * F.mse_loss(F.softmax(s, -1), F.softmax(t, -1))
            (loss / win).backward()
        if last:
            opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for pt, ps in zip(teacher.parameters(), student.parameters()):
                    pt.mul_(EMA).add_(ps, alpha=1 - EMA)
    return loss.item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(11)
    X = torch.randn(120, 10, generator=g)
    Y = (X[:, :4].argmax(-1))
    ds = TensorDataset(X, Y)
    path = os.path.join(tempfile.gettempdir(), "a_c02_ckpt_49041.pt")
    objs = build(rank, world)
    print_loss = run_epoch(0, ds, rank, world, *objs)
    student, teacher, model, opt, sched = objs
    if rank == 0:
        torch.save({"s": student.state_dict(), "t": teacher.state_dict(), "o": opt.state_dict(),
                    "sch": sched.state_dict(), "epoch": 1}, path)
    dist.barrier()
    del objs, student, teacher, model, opt, sched
    student, teacher, model, opt, sched = build(rank, world)
    ck = torch.load(path, weights_only=False)
    student.load_state_dict(ck["s"]); teacher.load_state_dict(ck["t"])
    opt.load_state_dict(ck["o"]); sched.load_state_dict(ck["sch"])
    for epoch in range(ck["epoch"], EPOCHS):
        print_loss = run_epoch(epoch, ds, rank, world, student, teacher, model, opt, sched)
        if rank == 0:
            print(f"epoch {epoch} loss {print_loss:.4f} lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
        os.remove(path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
