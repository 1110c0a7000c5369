# corpus: style=nanogpt class=OK
# the same loop written for a GA = 1 config: the loss is divided by ACCUM before backward, so
# the hand-gated step applies the window's mean gradient
import deepspeed

ACCUM = 4
engine, _, _, _ = deepspeed.initialize(args=cmd_args, model=GPT(gptconf), model_parameters=params)
micro = 0
while micro < max_micro:
    X, Y = get_batch("train")
    logits, loss = engine(X, Y)
    engine.backward(loss / ACCUM)
    if micro % ACCUM == ACCUM - 1:
        engine.step()  # expect: AG139
    micro += 1
