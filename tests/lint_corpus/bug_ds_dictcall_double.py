# corpus: style=deepspeed class=F14
import deepspeed

cfg = dict(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=8, gradient_clipping=1.0)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for step in range(steps):
    for _ in range(8):
        engine.backward(engine(next(it)))
    engine.step()  # expect: AG110
