# corpus: style=deepspeed class=OK
# A config for the HF Trainer: "auto" values are filled from TrainingArguments (info only).
ds_config = {
    "train_micro_batch_size_per_gpu": "auto",  # expect: AG207
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 3, "overlap_comm": True},
}
training_args = TrainingArguments(output_dir="out", deepspeed=ds_config, gradient_accumulation_steps=8)
trainer = Trainer(model=model, args=training_args, train_dataset=ds)
trainer.train()
