# corpus: style=hf class=LOSS_SCALE
# an MoE checkpoint loaded through AutoModel with the router loss on (the class is not in
# sight: a warning), GA of 4
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, output_router_logits=True)
args = TrainingArguments(output_dir="ckpt", gradient_accumulation_steps=4, learning_rate=1e-5)
Trainer(model=model, args=args, train_dataset=data).train()  # expect: AG132
