"""The one observation layer (hooks on backward, optimizers, zero_grad, schedulers,
clipping, sync flags, collectives, engine configs), shared by the guard, the
audit, ``accumguard watch`` and the framework callbacks."""

__all__: list[str] = []
