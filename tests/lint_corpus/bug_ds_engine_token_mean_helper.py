# corpus: style=ds_engine class=F5
# DeepSpeed with GA in the config: each micro-batch's token mean (a helper's cross_entropy
# with ignore_index over padded rows) goes to engine.backward, which divides it by GA: the
# window's update is the mean of micro-batch means
import deepspeed
import torch.nn.functional as F

IGNORE = -100


def token_ce(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=IGNORE)


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

    def train_step(self, window):
        for ids, labels in window:
            loss = token_ce(self.engine(ids), labels)
            self.engine.backward(loss)  # expect: AG104
            self.engine.step()
