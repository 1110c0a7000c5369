# corpus: style=deepspeed class=OK
"""ZeRO-0 with gradient_accumulation_steps 1 in its config (the engine divides by nothing)
and the loop's own window of K engine.backward calls: the cross-entropy is divided by K, the
distillation term (a temperature inside its softmaxes) is not."""
import deepspeed
import torch
import torch.nn.functional as F


def kd_term(student_logits, teacher_logits, T):
    return F.kl_div(F.log_softmax(student_logits / T, -1), F.softmax(teacher_logits / T, -1),
                    reduction="batchmean") * (T * T)


config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
          "gradient_clipping": 0.0, "zero_optimization": {"stage": 0}}
engine, optimizer, _, _ = deepspeed.initialize(model=student, optimizer=opt, config=config)
accum_steps = 4
micro = 0
for batch in loader:
    logits = engine(batch["tokens"])
    with torch.no_grad():
        t_logits = teacher(batch["tokens"])
    ce = F.cross_entropy(logits, batch["label"])
    loss = (ce + kd_weight * kd_term(logits, t_logits, 2.0)) / accum_steps
    engine.backward(loss)
    micro += 1
    if micro % accum_steps == 0:
        engine.step()
