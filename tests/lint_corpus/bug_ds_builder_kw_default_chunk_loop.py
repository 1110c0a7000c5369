# corpus: style=deepspeed class=F14
import deepspeed
import torch
import torch.distributed as dist

GRAD_ACCUM = 4


def make_ds_config(world, micro_bs=2, grad_accum=GRAD_ACCUM):
    return {
        "train_batch_size": micro_bs * grad_accum * world,
        "train_micro_batch_size_per_gpu": micro_bs,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": False},
        "zero_optimization": {"stage": 2},
    }


def main():
    deepspeed.init_distributed()
    model = torch.nn.Linear(32, 1)
    cfg = make_ds_config(dist.get_world_size())
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg
    )
    for _ in range(100):
        batch = torch.randn(8, 32)
        for micro in batch.chunk(GRAD_ACCUM):
            engine.backward(engine(micro).pow(2).mean())
        engine.step()  # expect: AG110


if __name__ == "__main__":
    main()
