# corpus: style=deepspeed class=F8
# ZeRO-0 with GA 8 in a dict config: engine.step() follows every backward (right), but the
# script clips by hand on every micro-batch, i.e. on partial sums of the window's gradient
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
    torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 1.0)  # expect: AG105
    engine.step()
