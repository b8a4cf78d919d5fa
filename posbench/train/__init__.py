"""The training layer: the recipe (``config``), device and precision (``device``), seeds, AdamW and its
schedule (``optim``), the loop (``trainer``), checkpoints that run no code (``checkpoint``) and several
processes under torchrun (``distributed``). It knows models and batches, nothing of tasks or runs."""

from posbench.train.config import TrainConfig

__all__ = ["NonFiniteLossError", "StopTraining", "TrainConfig", "TrainResult", "Trainer", "train"]


def __getattr__(name: str):
    """The trainer's names are imported when first asked for: a run's recorded ``train`` section
    (``TrainConfig``) is read without torch."""
    if name in __all__:
        from posbench.train import trainer  # torch: only what trains asks for the trainer
        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
