# corpus: style=deepspeed class=OK
import argparse

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn


def get_ds_config(micro_bs, gas):
    return {
        "train_micro_batch_size_per_gpu": micro_bs,
        "gradient_accumulation_steps": gas,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro_bs", type=int, default=4)
    parser.add_argument("--gas", type=int, default=4)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=get_ds_config(args.micro_bs, 1))
    loss_fn = nn.MSELoss()
    for _ in range(5):
        for _ in range(args.gas):
            x, y = torch.randn(args.micro_bs, 8), torch.randn(args.micro_bs, 4)
            engine.backward(loss_fn(engine(x), y) / args.gas)
        engine.step()  # unmanaged: this call is the boundary


if __name__ == "__main__":
    main()
