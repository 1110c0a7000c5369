# corpus: style=deepspeed class=F9
import deepspeed
import torch

model = torch.nn.Linear(256, 256)
engine, _, loader, _ = deepspeed.initialize(
    model=model,
    model_parameters=model.parameters(),
    training_data=dataset,
    config="ds_config_zero3_no_clip.json",  # expect: AG203
)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
