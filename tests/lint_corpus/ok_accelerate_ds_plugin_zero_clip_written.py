# corpus: style=accelerate class=OK
# The same plugin with the 0.0 written into the config it built: DeepSpeed does not clip.

from dataclasses import dataclass

import deepspeed
from accelerate.utils import DeepSpeedPlugin


@dataclass
class Cfg:
    zero_stage: int = 1
    grad_accum: int = 4
    max_grad_norm: float = 0.0


def engine(model, cfg: Cfg):
    plugin = DeepSpeedPlugin(zero_stage=cfg.zero_stage,
                             gradient_accumulation_steps=cfg.grad_accum,
                             gradient_clipping=cfg.max_grad_norm)
    plugin.deepspeed_config_process(must_match=False, train_micro_batch_size_per_gpu=4,
                                    train_batch_size=4 * cfg.grad_accum * 2)
    config = dict(plugin.deepspeed_config)
    config["gradient_clipping"] = cfg.max_grad_norm
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                   config=config)
    return eng


def train(eng, loader):
    for x, y in loader:
        eng.backward(eng(x, y))
        eng.step()
