# corpus: style=accelerate class=F9
# "No clipping" given to Accelerate's DeepSpeedPlugin as 0.0: the config the plugin builds
# keeps gradient_clipping only when it is truthy, so DeepSpeed clips at its default 1.0.
from dataclasses import dataclass

import deepspeed
from accelerate.utils import DeepSpeedPlugin


@dataclass
class Cfg:
    zero_stage: int = 1
    grad_accum: int = 4
    max_grad_norm: float = 0.0


def engine(model, cfg: Cfg):
    plugin = DeepSpeedPlugin(zero_stage=cfg.zero_stage,  # expect: AG182
                             gradient_accumulation_steps=cfg.grad_accum,
                             gradient_clipping=cfg.max_grad_norm)
    plugin.deepspeed_config_process(must_match=False, train_micro_batch_size_per_gpu=4,
                                    train_batch_size=4 * cfg.grad_accum * 2)
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                   config=dict(plugin.deepspeed_config))
    return eng


def train(eng, loader):
    for x, y in loader:
        eng.backward(eng(x, y))
        eng.step()
