# corpus: style=deepspeed class=OK
import deepspeed

ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
             "gradient_clipping": 0.0, "zero_optimization": {"stage": 2}}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
for step in range(steps):
    with engine.coalesce_grad_reduction():
        for _ in range(K):
            engine.backward(engine(next(it)), scale_wrt_gas=False)
    engine.step()
