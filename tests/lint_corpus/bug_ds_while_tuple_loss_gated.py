# corpus: style=nanogpt class=F14
# nanoGPT-style loop on a DeepSpeed engine: `logits, loss = engine(X, Y)` undivided, step()
# gated on `micro % ACCUM == ACCUM - 1`; the engine's GA (config on the command line) gates again
import deepspeed

ACCUM = 4
engine, _, _, _ = deepspeed.initialize(args=cmd_args, model=GPT(gptconf), model_parameters=params)
micro = 0
while micro < max_micro:
    X, Y = get_batch("train")
    logits, loss = engine(X, Y)
    engine.backward(loss)
    if micro % ACCUM == ACCUM - 1:
        engine.step()  # expect: AG110
    micro += 1
