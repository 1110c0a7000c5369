# corpus: style=deepspeed class=F14
import deepspeed

ds_cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0}
ds_cfg.update({"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}})


def train(model, loader):
    model_engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_cfg)
    accum = 4
    for i, batch in enumerate(loader):
        loss = model_engine(batch)
        model_engine.backward(loss)
        if (i + 1) % accum == 0:
            model_engine.step()  # expect: AG110
