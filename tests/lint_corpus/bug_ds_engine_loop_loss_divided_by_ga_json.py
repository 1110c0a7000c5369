# corpus: style=deepspeed class=LOSS_SCALE
import argparse

import deepspeed
import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", default="ds_config_ga4.json")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    args = parser.parse_args()
    model = torch.nn.Linear(16, 4)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=torch.utils.data.TensorDataset(torch.randn(64, 16)))
    for step, (x,) in enumerate(loader):
        logits = engine(x)
        loss = F.cross_entropy(logits, logits.argmax(-1))
        loss = loss / args.gradient_accumulation_steps
        engine.backward(loss)  # expect: AG134
        engine.step()


if __name__ == "__main__":
    main()
