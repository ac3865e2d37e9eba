"""The losses a model's forward pass adds (a layer's ``add_loss``, activity regularizers).

Keras computes such a loss over the whole batch it is given: a layer's
``self.add_loss(keras.ops.sum(inputs))`` sums the rows of that batch. A step that runs the forward
pass on each replica's (or worker's) share of the global batch and averages the shares' losses
therefore computes one device's loss only when every such term is a mean of per-example terms,
which nothing in a model says (a sum is halved on 2 replicas; a term nonlinear in the batch cannot
be rebuilt from the shares at all). The steps that cut a batch into shares ask :func:`problem`
and keep such models on a program over the whole batch, or refuse them.

Weight regularizers (``kernel_regularizer``) read no batch and are not counted: Keras adds them
outside the forward pass, and every share computes the same value.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import keras

# Each model's count, from the first batch it was asked about: a model's layers, hence the
# losses they add, do not change once it is built.
_counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def count(model: Any, first_batch: Callable[[], Any]) -> int:
    """How many losses ``model``'s training forward pass adds, traced abstractly on
    ``first_batch()`` (one batch of its input, any rows; nothing is computed and no variable
    changes) the first time a model is asked about."""
    if model not in _counts:
        _counts[model] = _traced_count(model, first_batch())
    return _counts[model]


def _traced_count(model: Any, batch: Any) -> int:
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    # Abstract values, as Keras' train step passes its state: while Keras' loop runs, the
    # variables themselves may hold no value.
    variables = [*model.trainable_variables, *model.non_trainable_variables]
    specs = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in variables]

    def losses(values: list[Any], x: Any) -> list[Any]:
        # Keras' train step collects the forward losses the same way (``stateless_call`` with
        # ``return_losses``); variable updates (BatchNorm statistics, seeds) stay in the scope.
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True)),
                                  collect_losses=True) as scope:
            model(x, training=True)
        return list(scope.losses)

    return len(jax.eval_shape(losses, specs, x))


def problem(model: Any, first_batch: Callable[[], Any]) -> str | None:
    """Why ``model``'s loss on a batch may not be the mean of its losses on shares of the
    batch, or ``None`` when its forward pass adds no loss (:func:`count` on ``first_batch``)."""
    added = count(model, first_batch)
    if not added:
        return None
    return (f"its forward pass adds {added} loss term(s) (a layer's add_loss or an activity "
            "regularizer), which Keras computes over the whole batch it is given")
