# corpus: style=deepspeed class=OK
import deepspeed

model_engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
gas = model_engine.gradient_accumulation_steps()
for step, batch in enumerate(loader):
    loss = model_engine(batch).mean()
    model_engine.backward(loss)
    model_engine.step()
    if (step + 1) % gas == 0 and model_engine.global_rank == 0:
        print(f"update {(step + 1) // gas}: loss {loss.item():.4f}")
