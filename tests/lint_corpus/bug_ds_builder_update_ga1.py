# corpus: style=deepspeed class=F2
import deepspeed
import torch


def make_config(micro_bs):
    cfg = {"train_micro_batch_size_per_gpu": micro_bs, "gradient_clipping": 1.0}
    cfg["zero_optimization"] = {"stage": 2, "reduce_scatter": True}
    cfg.update(gradient_accumulation_steps=1)
    return cfg


def main(model, loader, accum=4):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=make_config(8))
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss / accum)
        if (step + 1) % accum == 0:
            engine.step()  # expect: AG109
