# corpus: style=deepspeed class=OK
import deepspeed
import torch.nn.functional as F
from torch.utils.data import DataLoader

ds_config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 3,
    "gradient_clipping": 2.0,
    "zero_optimization": {"stage": 0},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
}


def train_segment(engine, train_set, skip_micro, stop_step):
    loader = DataLoader(train_set, batch_size=4, shuffle=False, drop_last=True)
    micro = 0
    for x, y in loader:
        if micro < skip_micro:  # fast-forward past what the previous run consumed
            micro += 1
            continue
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        micro += 1
        if engine.global_steps >= stop_step:
            break


def main(model, train_set):
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)
    train_segment(engine, train_set, 0, 3)
    engine.save_checkpoint("ckpt", client_state={"micro": 9})
    _, state = engine.load_checkpoint("ckpt")
    train_segment(engine, train_set, state["micro"], 6)
