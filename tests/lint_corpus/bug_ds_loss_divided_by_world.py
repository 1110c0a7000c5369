# corpus: style=deepspeed class=F10
import deepspeed
import torch
import torch.distributed as dist


def main(args, net, loader):
    engine, _, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters())
    world_size = dist.get_world_size()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        loss = loss / world_size  # expect: AG112
        engine.backward(loss)
        engine.step()
