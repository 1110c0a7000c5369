# corpus: style=deepspeed class=F14
# GA is not written but derived: train_batch_size = micro x grad_accum x world size.
import deepspeed
import torch.distributed as dist


def build_and_train(model, loader, micro_bs=4, grad_accum=8):
    world_size = dist.get_world_size()
    ds_config = {
        "train_batch_size": micro_bs * grad_accum * world_size,
        "train_micro_batch_size_per_gpu": micro_bs,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    it = iter(loader)
    for update in range(1000):
        for micro in range(grad_accum):
            engine.backward(engine(next(it)) / grad_accum)
        engine.step()  # expect: AG110
