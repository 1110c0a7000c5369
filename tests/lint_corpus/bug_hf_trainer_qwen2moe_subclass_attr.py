# corpus: style=hf class=LOSS_SCALE
# a Trainer subclass that only logs, a Qwen2-MoE built from a config whose router flag is set
# after construction, and GA set on the arguments object
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Trainer, TrainingArguments


class LoggingTrainer(Trainer):
    def log(self, logs, start_time=None):
        logs["experts"] = 8
        super().log(logs, start_time)


cfg = Qwen2MoeConfig(num_experts=8, num_experts_per_tok=2, hidden_size=128)
cfg.output_router_logits = True
net = Qwen2MoeForCausalLM.from_config(cfg)
targs = TrainingArguments("run", per_device_train_batch_size=2, bf16=True)
targs.gradient_accumulation_steps = 16
LoggingTrainer(model=net, args=targs, train_dataset=ds).train()  # expect: AG132
