# corpus: style=torch_distributed class=OK
# The PyTorch tutorial's average_gradients: in-place division on .data by a float size.
import torch.distributed as dist


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank, model, optimizer, train_set):
    for data, target in train_set:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        average_gradients(model)
        optimizer.step()
