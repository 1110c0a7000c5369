# corpus: style=deepspeed class=OK
# GA 1 in the config: every engine.step() is an optimizer step, so clipping after each
# backward clips each update's full gradient
import deepspeed
import torch

engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                            training_data=dataset, config="ds_config_ga1.json")
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 1.0)
    engine.step()
