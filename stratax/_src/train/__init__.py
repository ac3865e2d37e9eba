"""``stratax train``: the main job, a digits classifier trained under a strategy, no network.

The flags live in :mod:`stratax._src.train.arguments` (no JAX or Keras import), the run in
:mod:`stratax._src.train.runner`, the models in :mod:`stratax._src.train.models`. This package
imports only the light modules, so the CLI can parse flags and split the CPU before JAX starts.
"""

from stratax._src.train.arguments import add_train_arguments, build_parser, run_train
from stratax._src.train.config import TrainConfig, check_batch_size

__all__ = ["TrainConfig", "add_train_arguments", "build_parser", "check_batch_size", "run_train"]
