# corpus: style=deepspeed class=F2
import deepspeed

cfg = dict(train_micro_batch_size_per_gpu=4, gradient_clipping=1.0, zero_optimization=dict(stage=2))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for step in range(num_steps):
    for micro in range(accum_steps):
        engine.backward(engine(next(it)) / accum_steps)
    engine.step()  # expect: AG109
