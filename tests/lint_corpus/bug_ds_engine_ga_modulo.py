# corpus: style=deepspeed class=F14
import deepspeed

engine, optimizer, _, scheduler = deepspeed.initialize(args=cmd_args, model=net, model_parameters=net.parameters())
for step, batch in enumerate(train_loader):
    loss = engine(batch["x"]).pow(2).mean()
    engine.backward(loss)
    # step "at the boundary": but the engine already counts its own boundary in step()
    if (step + 1) % engine.gradient_accumulation_steps() == 0:
        engine.step()  # expect: AG110
