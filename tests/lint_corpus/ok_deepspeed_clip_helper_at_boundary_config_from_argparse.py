# corpus: style=deepspeed class=OK
import argparse

import deepspeed
import torch


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--micro", type=int, default=4)
    return p.parse_args()


def build_config(args):
    return {"train_micro_batch_size_per_gpu": args.micro,
            "gradient_accumulation_steps": args.accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def one_micro_step(engine, x, y):
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    if engine.is_gradient_accumulation_boundary():
        torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 1.0)
    engine.step()
    return loss


def main(model, batches):
    args = parse()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=build_config(args))
    for x, y in batches:
        one_micro_step(engine, x, y)
