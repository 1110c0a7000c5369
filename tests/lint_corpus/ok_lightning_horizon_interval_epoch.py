# corpus: style=lightning class=OK
import lightning as L
import torch

EPOCHS = 30


class ImageModule(L.LightningModule):
    def __init__(self, backbone, lr=0.1):
        super().__init__()
        self.backbone = backbone
        self.lr = lr

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.backbone(images), labels)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, nesterov=True)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            opt, T_max=EPOCHS, eta_min=1e-5
        )
        return [opt], [{"scheduler": sched, "interval": "epoch"}]


trainer = L.Trainer(max_epochs=EPOCHS, accumulate_grad_batches=8, precision="bf16-mixed")
