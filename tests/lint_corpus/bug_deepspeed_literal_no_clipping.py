# corpus: style=deepspeed class=F9
import deepspeed

config = {  # expect: AG203
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for batch in loader:
    engine.backward(engine(batch))
    engine.step()
