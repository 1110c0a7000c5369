# corpus: style=deepspeed class=OK
# bf16 with ZeRO-2 and 256 micro-batches, accumulated in fp32 (data_types.grad_accum_dtype)
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 256,
    "gradient_clipping": 0.0,
    "bf16": {"enabled": True},
    "data_types": {"grad_accum_dtype": "fp32"},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for batch in loader:
    engine.backward(engine(batch))
    engine.step()
