# corpus: style=deepspeed class=OK
import argparse

import deepspeed
import torch
import torch.nn.functional as F

MICRO_BATCH_SIZE = 8


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", default="ds_config_ga4.json")
    args = parser.parse_args()
    model = torch.nn.Linear(16, 4)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=torch.utils.data.TensorDataset(torch.randn(64, 16)))
    for step, (x,) in enumerate(loader):
        logits = engine(x)
        loss = F.cross_entropy(logits, logits.argmax(-1), reduction="sum")
        loss = loss / MICRO_BATCH_SIZE
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main()
