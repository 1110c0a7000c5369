# corpus: style=deepspeed class=OK
# GA 1 in the config, the loop accumulates by hand and tells the engine where the boundary is.
import deepspeed

ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2, "overlap_comm": False},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config)
K = 4
for window in windows(loader, K):
    for j, mb in enumerate(window):
        engine.set_gradient_accumulation_boundary(j == len(window) - 1)
        engine.backward(engine(mb).sum() / len(window), scale_wrt_gas=False)
    engine.step()
