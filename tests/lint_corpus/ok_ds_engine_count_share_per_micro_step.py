# corpus: style=ds_engine class=OK
import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F


def train(model, batches, args):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": args.accum,
           "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    gas, world = engine.gradient_accumulation_steps(), dist.get_world_size()
    for s in range(args.steps):
        window = batches[s * gas:(s + 1) * gas]
        n = torch.tensor(float(sum(int((y != -100).sum()) for _, y in window)))
        dist.all_reduce(n)
        # the engine divides by gas and averages over ranks: undo both
        share = n.item() / (gas * world)
        for x, y in window:
            tot = F.cross_entropy(engine(x).flatten(0, 1), y.flatten(), reduction="sum")
            engine.backward(tot / share)
            engine.step()
