# corpus: style=ddp class=OK
# summed loss over the window's label count, counted over the micro-batch list and all-reduced
# once per window, times W (DDP averages): the large batch's mean, not a mean of means
import torch
import torch.distributed as dist
import torch.nn.functional as F

model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
grad_accum = 4
for step in range(steps):
    microbatches = [next(it) for _ in range(grad_accum)]
    num_labels = sum((mb["labels"] != -100).sum() for mb in microbatches)
    dist.all_reduce(num_labels)
    for mb in microbatches:
        logits = model(mb["input_ids"])
        loss_sum = F.cross_entropy(logits.flatten(0, 1), mb["labels"].flatten(), ignore_index=-100, reduction="sum")
        loss = loss_sum * dist.get_world_size() / num_labels
        loss.backward()
    opt.step()
    opt.zero_grad()
