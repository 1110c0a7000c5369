# corpus: style=deepspeed class=OK
import deepspeed

ds_cfg = {"train_micro_batch_size_per_gpu": 8}
ds_cfg.update({"gradient_accumulation_steps": 8, "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}})


def train(model, loader):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
