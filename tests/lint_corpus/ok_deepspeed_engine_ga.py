# corpus: style=deepspeed class=OK
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
for batch in loader:
    loss = engine(batch)
    engine.backward(loss)
    engine.step()
