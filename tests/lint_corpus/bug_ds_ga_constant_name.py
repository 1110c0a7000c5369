# corpus: style=deepspeed class=F14
# The config's GA is the same K the loop accumulates by hand: double gating.
import deepspeed

ACCUM = 4
MICRO_BS = 8
config = {
    "train_micro_batch_size_per_gpu": MICRO_BS,
    "gradient_accumulation_steps": ACCUM,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": False},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
}
model_engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for epoch in range(epochs):
    for batch in loader:
        for mb in batch.split(MICRO_BS):
            loss = model_engine(mb).loss
            model_engine.backward(loss / ACCUM)
        model_engine.step()  # expect: AG110
