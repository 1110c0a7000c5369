# corpus: style=deepspeed class=F4
# the engine gates its step (GA 4 in the config) but the user's own scheduler steps per micro-batch
import deepspeed
from torch.optim.lr_scheduler import OneCycleLR

engine, optimizer, loader, _ = deepspeed.initialize(
    model=model, model_parameters=params, config="ds_config_ga4.json"
)
sched = OneCycleLR(optimizer, max_lr=1e-3, total_steps=1000)
for batch in loader:
    loss = engine(batch)
    engine.backward(loss)
    engine.step()
    sched.step()  # expect: AG103
