"""Keras' default seeds, agreed by the workers of a multi-process strategy.

Every worker must initialise the same variables: TensorFlow broadcasts the chief's initial
values; here every worker draws the same seeds. A Keras initializer or ``SeedGenerator`` built
without a seed draws one from Python's ``random`` (``keras.random``'s ``make_default_seed``), and
unseeded ``keras.random`` calls use Keras' global ``SeedGenerator``. So, when the program set no
Keras seed (``keras.utils.set_random_seed``), the workers agree on those two and on nothing
else:

- the first multi-process ``scope()`` copies worker 0's Python ``random`` state into a stream of
  Keras' own, and worker 0's global ``SeedGenerator`` state (if one exists) to every worker;
- inside every such ``scope()`` Keras draws its seeds from that stream (Python's ``random`` holds
  the stream's state and gets the user's back on exit).

TensorFlow's global seed (``tf.data``'s seeded shuffles), numpy's and Python's own streams stay
the user's: a ``shuffle(4096, seed=1)`` runs in plain Keras' order, run after run, and the seeds
Keras draws are those plain Keras draws on worker 0 (so a program that seeds Python's ``random``
builds the same weights as plain Keras).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
from jax.experimental import multihost_utils

from stratax._src import seam

_WORDS = 625  # Mersenne Twister: 624 state words and the position


def _broadcast_python_state(state: tuple) -> tuple:
    """``random.getstate()`` of worker 0, on every worker."""
    version, words, gauss = state
    packed = np.concatenate([
        np.asarray(words, np.uint32),
        np.asarray([gauss is not None], np.uint32),
        np.asarray([gauss or 0.0], np.float64).view(np.uint32),
    ])
    got = np.asarray(multihost_utils.broadcast_one_to_all(packed), np.uint32)
    gauss_next = float(got[_WORDS + 1:].view(np.float64)[0]) if got[_WORDS] else None
    return version, tuple(int(w) for w in got[:_WORDS]), gauss_next


class AgreedSeeds:
    """Keras' source of default seeds, shared by the workers (see the module docstring).

    One instance per process (``AGREED_SEEDS``); a test can make more.
    """

    def __init__(self) -> None:
        self._stream: random.Random | None = None
        self._depth = 0

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Inside, Keras' default seeds come from the agreed stream (a collective on first use:
        every worker must enter it, as every worker enters ``strategy.scope()``)."""
        if self._depth or seam.keras_random_seed() is not None:
            # Nested, or seeded by the program (every worker then draws alike already).
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        if self._stream is None:
            self._stream = random.Random()
            self._stream.setstate(_broadcast_python_state(random.getstate()))
            generator = seam.keras_global_seed_generator()
            if generator is not None:
                generator.state.assign(np.asarray(
                    multihost_utils.broadcast_one_to_all(np.asarray(generator.state.value))))
        users = random.getstate()
        random.setstate(self._stream.getstate())
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self._stream.setstate(random.getstate())
            random.setstate(users)


AGREED_SEEDS = AgreedSeeds()


def agreed_draw(draw: int, num_processes: int) -> int:
    """Worker 0's ``draw`` on every worker (each drew its own, as one process would)."""
    if num_processes == 1:
        return draw
    return int(multihost_utils.broadcast_one_to_all(np.asarray(draw, np.int32)))
