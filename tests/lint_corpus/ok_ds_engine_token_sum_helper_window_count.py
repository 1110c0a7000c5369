# corpus: style=ds_engine class=OK
# DeepSpeed with GA in the config: each micro-batch's token sum over the window's count,
# times GA x W (engine.backward divides by GA, the ranks are averaged): every token weighs
# 1 / the window's count
import deepspeed
import torch.nn.functional as F

IGNORE = -100


def token_ce(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


class SFTTrainer:
    def __init__(self, c, model, world):
        ds_cfg = {
            "train_micro_batch_size_per_gpu": c.micro_batch,
            "gradient_accumulation_steps": c.accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 1},
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=ds_cfg)

    def train_step(self, window, n_window, world):
        for ids, labels in window:
            loss = token_ce(self.engine(ids), labels) * self.engine.gradient_accumulation_steps() * world / n_window
            self.engine.backward(loss)
            self.engine.step()
