# corpus: style=deepspeed class=OK
# the documented engine loop: the loss goes to the engine as it is; the engine divides by
# its own GA and steps once per GA backward() calls
import deepspeed


def train(net, batches, args):
    engine, _, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters())
    for batch in batches:
        loss = engine(batch["x"], batch["y"])
        engine.backward(loss)
        engine.step()
