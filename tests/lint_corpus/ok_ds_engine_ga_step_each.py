# corpus: style=deepspeed class=OK
# The engine's GA is read to size the data and the logging; step() after every backward:
# DeepSpeed decides which step() call is the boundary.
import deepspeed

engine, optimizer, _, _ = deepspeed.initialize(args=cmd_args, model=net, model_parameters=net.parameters())
gas = engine.gradient_accumulation_steps()
for update in range(num_updates):
    for _ in range(gas):
        x, y = next(data_iter)
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        print(update, loss.item())
