# corpus: style=accelerate class=OK
import torch
import torch.nn.functional as F
from accelerate import Accelerator


class Distiller:
    def __init__(self, student, teacher, loader):
        self.accelerator = Accelerator(gradient_accumulation_steps=4)
        # the teacher only runs under no_grad: placing it is all prepare_model does for it
        self.accelerator.prepare_model(teacher, device_placement=True)
        self.teacher = teacher
        opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
        self.student, self.opt, self.loader = self.accelerator.prepare(student, opt, loader)

    def fit(self):
        for x, _ in self.loader:
            with self.accelerator.accumulate(self.student):
                with torch.no_grad():
                    target = self.teacher(x)
                loss = F.mse_loss(self.student(x), target)
                self.accelerator.backward(loss)
                self.opt.step()
                self.opt.zero_grad()
