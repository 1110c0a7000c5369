# corpus: style=deepspeed class=F6
# DeepSpeed ZeRO-3 with the loss summed over tokens and divided by this rank's own window
# token count (times GA to undo DeepSpeed's division): the engine's average over ranks then
# weighs each rank's tokens by 1 / (W x its own count)
import deepspeed
import torch


def train(model, windows, cfg):
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    ga = engine.gradient_accumulation_steps()
    for window in windows:
        n_tokens = torch.tensor(sum(int((y != -100).sum()) for _, y in window), dtype=torch.float64)
        for x, y in window:
            loss = sum_token_ce(engine(x), y) * ga / n_tokens  # expect: AG113
            engine.backward(loss)
            engine.step()
