# corpus: style=deepspeed class=OK
import deepspeed
import torch.nn.functional as F

GA = 4
ds_config = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": GA,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def kd_loss(student_logits, teacher_logits, temperature, accumulation_steps):
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2
    return kl


def total_loss(student_logits, teacher_logits, labels, kd_weight):
    ce = F.cross_entropy(student_logits, labels)
    kd = kd_loss(student_logits, teacher_logits, 2.0, GA)
    return ce + kd_weight * kd, ce.detach(), kd.detach()


def main(student, teacher, loader):
    engine, _, _, _ = deepspeed.initialize(model=student, model_parameters=student.parameters(),
                                           config=ds_config)
    for images, labels in loader:
        t_logits = teacher(images)
        loss, ce, kd = total_loss(engine(images), t_logits, labels, 0.7)
        engine.backward(loss)
        engine.step()
