# corpus: style=hf class=LOSS_SCALE
# stock Trainer, tiny Mixtral with the router loss on, accumulation of 8: the model adds
# router_aux_loss_coef * aux_loss per micro-batch and nothing divides it by K
from transformers import MixtralConfig, MixtralForCausalLM, Trainer, TrainingArguments

config = MixtralConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_local_experts=4,
                       output_router_logits=True, router_aux_loss_coef=0.02)
model = MixtralForCausalLM(config)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, gradient_accumulation_steps=8)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, data_collator=collator)  # expect: AG132
trainer.train()
