# corpus: style=deepspeed class=LOSS_SCALE
# the documented engine loop, but the loss is first divided by the engine's own GA: the
# engine's backward divides by GA again, so every window's gradient is G / GA
import deepspeed


def train(net, batches, args):
    engine, _, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters())
    ga = engine.gradient_accumulation_steps()
    for batch in batches:
        loss = engine(batch["x"], batch["y"]) / ga
        engine.backward(loss)  # expect: AG134
        engine.step()
