"""``TrainConfig``: what ``stratax train`` runs, validated before JAX starts.

Pure Python (no JAX, no Keras), so the command line can be checked, and the CPU split into
replicas, before anything fixes the device count.
"""

from __future__ import annotations

import dataclasses

# Model names of ``--model``; ``stratax._src.train.models.MODELS`` builds them.
MODEL_NAMES = ("mlp", "cnn")
DEFAULT_STRATEGY = "mirrored"
DEFAULT_MODEL = "mlp"
# Enough epochs of Adam(1e-3) at global batch 64 for either model to converge on the digits in
# seconds (the accuracy it reaches: docs/design/performance.md, "Numbers behind the code's
# choices").
DEFAULT_EPOCHS = 30
DEFAULT_BATCH_SIZE = 64
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_SEED = 0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One ``stratax train`` run.

    Attributes:
        strategy: registered strategy name (``stratax._src.strategies.registry``).
        devices: split the host CPU into this many JAX devices first; ``None`` keeps the
            devices JAX finds (one CPU device unless ``STRATAX_CPU_DEVICES`` is set).
        model: ``"mlp"`` or ``"cnn"``.
        epochs: passes over the training split.
        batch_size: the *global* batch, split evenly over the replicas.
        learning_rate: Adam's learning rate.
        seed: seeds weights and shuffling (``keras.utils.set_random_seed``); the train/test
            split is fixed (split seed 0) so accuracies are comparable across runs.
        verbose: Keras' ``fit`` verbosity: 0 silent, 1 progress bar, 2 one line per epoch.
        min_accuracy: fail (exit code 1) when the test accuracy ends below this; ``None``: never.
        run_dir: when set, training speed and epoch logs go to this run directory
            (``sx.callbacks.WorkerMetrics``), for ``--dashboard`` / ``stratax dashboard``.

    Example:
        >>> TrainConfig(devices=2, epochs=5).validate()
    """

    strategy: str = DEFAULT_STRATEGY
    devices: int | None = None
    model: str = DEFAULT_MODEL
    epochs: int = DEFAULT_EPOCHS
    batch_size: int = DEFAULT_BATCH_SIZE
    learning_rate: float = DEFAULT_LEARNING_RATE
    seed: int = DEFAULT_SEED
    verbose: int = 2
    min_accuracy: float | None = None
    run_dir: str | None = None

    def validate(self) -> None:
        """Checks every field that can be checked without JAX.

        The batch size against the replica count is checked once the strategy exists
        (:func:`check_batch_size`).

        Raises:
            ValueError: a field is out of range; the message names the flag and the fix.
        """
        if self.devices is not None and (_not_int(self.devices) or self.devices < 1):
            raise ValueError(f"--devices must be a positive integer; received {self.devices!r}.")
        if self.model not in MODEL_NAMES:
            raise ValueError(
                f"Unknown model {self.model!r}; choose one of {list(MODEL_NAMES)}, e.g. "
                f"--model {MODEL_NAMES[0]}."
            )
        if _not_int(self.epochs) or self.epochs < 1:
            raise ValueError(f"--epochs must be a positive integer; received {self.epochs!r}.")
        if _not_int(self.batch_size) or self.batch_size < 1:
            raise ValueError(
                f"--batch-size must be a positive integer; received {self.batch_size!r}."
            )
        if not self.learning_rate > 0:
            raise ValueError(
                f"--learning-rate must be positive; received {self.learning_rate!r}."
            )
        if self.verbose not in (0, 1, 2):
            raise ValueError(f"--verbose must be 0, 1 or 2; received {self.verbose!r}.")
        if self.min_accuracy is not None and not 0.0 <= self.min_accuracy <= 1.0:
            raise ValueError(
                f"--min-accuracy must be between 0 and 1; received {self.min_accuracy!r} "
                "(e.g. --min-accuracy 0.95 for 95%)."
            )


def check_batch_size(batch_size: int, num_replicas: int) -> None:
    """Raises ``ValueError`` unless the global ``batch_size`` splits evenly over the replicas."""
    # Imported here: the policy module needs numpy, which `stratax --help` can do without.
    from stratax._src.distributed_input import global_batch

    global_batch.check_divisible(batch_size, num_replicas,
                                 hint="`stratax train --batch-size={batch}`")


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)
