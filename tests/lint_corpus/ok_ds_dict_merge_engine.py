# corpus: style=deepspeed class=OK
import deepspeed

BASE = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0}


def build():
    return {**BASE, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}}  # expect: AG205


def train(model, loader):
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=build())
    for batch in loader:
        engine.backward(engine(batch).mean())
        engine.step()
