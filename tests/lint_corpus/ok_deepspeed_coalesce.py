# GA 1 in the config + one coalesced reduction per step: correct and cheap
import deepspeed

engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config_ga1.json")
micro_batches_per_step = 4
for batch in loader:
    with engine.coalesce_grad_reduction():
        for micro in batch.chunk(micro_batches_per_step):
            loss = engine(micro).sum() / batch.numel()
            engine.backward(loss, scale_wrt_gas=False)
    engine.step()
