# corpus: style=ddp_manual class=OK
# no DDP wrapper: the gradients are all-reduced with SUM by hand at the boundary, so the summed
# loss divided by micro_bsz * K * world_size gives the global mean exactly
import torch
import torch.distributed as dist
import torch.nn.functional as F

dist.init_process_group("gloo")
micro_bsz, accum = 8, 4
global_batch = micro_bsz * accum * dist.get_world_size()
model = build_model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i, (x, y) in enumerate(loader):
    loss = F.mse_loss(model(x), y, reduction="sum") / global_batch
    loss.backward()
    if (i + 1) % accum == 0:
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        opt.step()
        opt.zero_grad()
