# corpus: style=deepspeed class=F13
# ZeRO-3 with GA 1 accumulates across engine.backward() calls; the hand-written boundary
# is off by one (step % accum with step from 0, after the backward).
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 3, "overlap_comm": True},
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
accum = 4
for step, batch in enumerate(loader):
    loss = engine(batch) / accum
    engine.backward(loss)
    if step % accum == 0:  # expect: AG115
        engine.step()
