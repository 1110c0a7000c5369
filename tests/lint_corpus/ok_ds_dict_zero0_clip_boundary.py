# corpus: style=deepspeed class=OK
# the same loop clipping only at the engine's boundary, on the full gradient, before step()
import deepspeed
import torch

ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 0.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "zero_optimization": {"stage": 0},
}
engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                            training_data=dataset, config=ds_config)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    if engine.is_gradient_accumulation_boundary():
        torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 1.0)
    engine.step()
