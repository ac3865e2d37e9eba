"""Optimizer updates applied on a parameter server, with numpy, from a Keras optimizer config.

The coordinator sends the optimizer as data (``{"class_name": "Adam", "config": {...}}``, what
``keras.optimizers.serialize`` gives), never as code. Supported: ``SGD`` (with ``momentum`` and
``nesterov``) and ``Adam``; the formulas are Keras 3's, so a dense update here equals Keras'.

Row-sparse gradients (an embedding's touched rows): SGD is exact either way. For Adam and
momentum two semantics exist, chosen by ``sparse_updates``:

- ``"dense"`` (default): the gradient is scattered into zeros and the whole shard gets a dense
  update, exactly what Keras (and TensorFlow) do on one device: every row's moments decay each
  step.
- ``"lazy"`` (opt-in, like ``torch.optim.SparseAdam`` / TF Addons ``LazyAdam``): only the touched
  rows' slots and values change; cost proportional to the rows touched, a different rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

SPARSE_MODES = ("dense", "lazy")
_BLOCK_BYTES = 1 << 18  # rows updated together by the dense rule: a block fits in cache
DEFAULT_SPARSE_UPDATES = "dense"  # Keras' rule; "lazy" changes the math, so it is an opt-in
# Keras optimizer options the parameter server does not apply; set, they are an error rather
# than silently ignored.
_UNSUPPORTED = ("weight_decay", "clipnorm", "global_clipnorm", "clipvalue", "use_ema",
                "loss_scale_factor", "gradient_accumulation_steps", "amsgrad")


def _number(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"Optimizer field {key!r} is {value!r}; the parameter server needs a number "
            "(learning-rate schedules are not supported there yet: pass a float)."
        )
    return float(value)


class ShardOptimizer:
    """Holds one shard's optimizer slots and applies dense or row-sparse updates to it in place."""

    def __init__(self, spec: Mapping[str, Any], value: np.ndarray,
                 sparse_updates: str = DEFAULT_SPARSE_UPDATES):
        if not isinstance(spec, Mapping) or "class_name" not in spec:
            raise TypeError("Optimizer spec must be {'class_name': ..., 'config': ...}, "
                            f"got {spec!r}.")
        name = str(spec["class_name"]).split(">")[-1]
        config = spec.get("config") or {}
        if name not in ("SGD", "Adam"):
            raise ValueError(
                f"The parameter server applies SGD or Adam, got optimizer {name!r}; use "
                "keras.optimizers.SGD or keras.optimizers.Adam with ParameterServerStrategy."
            )
        unsupported = [k for k in _UNSUPPORTED if config.get(k) not in (None, False)]
        if unsupported:
            raise ValueError(
                f"Optimizer options {unsupported} are not applied on the parameter server yet; "
                "leave them unset (clip gradients inside the step instead)."
            )
        if sparse_updates not in SPARSE_MODES:
            raise ValueError(f"sparse_updates must be one of {SPARSE_MODES}, "
                             f"got {sparse_updates!r}.")
        self.name = name
        self.sparse_updates = sparse_updates
        self.lr = _number(config, "learning_rate", 0.01 if name == "SGD" else 0.001)
        self.iterations = 0
        dtype = value.dtype
        if name == "SGD":
            self.momentum = _number(config, "momentum", 0.0)
            self.nesterov = bool(config.get("nesterov", False))
            self.slots = {"m": np.zeros_like(value)} if self.momentum else {}
        else:
            self.beta_1 = _number(config, "beta_1", 0.9)
            self.beta_2 = _number(config, "beta_2", 0.999)
            self.epsilon = _number(config, "epsilon", 1e-7)
            self.slots = {"m": np.zeros_like(value), "v": np.zeros_like(value)}
        self._dtype = dtype

    def apply_dense(self, value: np.ndarray, grad: np.ndarray) -> None:
        """One update of the whole shard with a dense gradient (Keras' formulas)."""
        grad = grad.astype(self._dtype, copy=False)
        if self.name == "SGD":
            self._sgd(value, grad, None)
        else:
            self._adam(value, grad, None)
        self.iterations += 1

    def apply_rows(self, value: np.ndarray, rows: np.ndarray, grad: np.ndarray) -> None:
        """One update from gradients of distinct ``rows`` (local row indices of this shard)."""
        grad = grad.astype(self._dtype, copy=False)
        if self.sparse_updates == "dense" and self.name == "Adam" and value.ndim:
            self._adam_every_row(value, rows, grad)
            self.iterations += 1
            return
        if self.sparse_updates == "dense" and (self.name == "Adam" or self.slots):
            dense = np.zeros_like(value)
            dense[rows] = grad
            self.apply_dense(value, dense)
            return
        if self.name == "SGD":
            self._sgd(value, grad, rows)
        else:
            self._adam(value, grad, rows)
        self.iterations += 1

    def _adam_every_row(self, value: np.ndarray, rows: np.ndarray, grad: np.ndarray) -> None:
        """Keras' Adam step for a gradient that is zero but on ``rows`` (sorted, distinct):
        every row's moments decay, as ``apply_dense`` of the scattered gradient does, to the
        same bits, without building that gradient; a block of rows at a time, so each block's
        passes run in cache."""
        t = self.iterations + 1
        lr = self.lr * math.sqrt(1 - self.beta_2 ** t) / (1 - self.beta_1 ** t)
        m, v = self.slots["m"], self.slots["v"]
        block = max(1, _BLOCK_BYTES // max(value[0].nbytes, 1))
        scratch = np.empty((min(block, len(value)), *value.shape[1:]), value.dtype)
        bounds = np.searchsorted(rows, np.arange(0, len(value) + block, block))
        for i, start in enumerate(range(0, len(value), block)):
            end = min(start + block, len(value))
            m_b, v_b, step = m[start:end], v[start:end], scratch[:end - start]
            m_b *= self.beta_1
            v_b *= self.beta_2
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:  # the looked-up rows' terms; every other row's gradient is zero
                local, g = rows[lo:hi] - start, grad[lo:hi]
                m_b[local] += (1 - self.beta_1) * g
                v_b[local] += (1 - self.beta_2) * np.square(g)
            np.sqrt(v_b, out=step)
            step += self.epsilon
            np.divide(m_b, step, out=step)
            step *= lr
            value[start:end] -= step

    def _sgd(self, value: np.ndarray, grad: np.ndarray, rows: np.ndarray | None) -> None:
        index = ... if rows is None else rows  # ``...`` indexes a scalar too
        if not self.slots:
            value[index] -= self.lr * grad
            return
        m = self.slots["m"]
        m_new = self.momentum * m[index] - self.lr * grad
        m[index] = m_new
        if self.nesterov:
            value[index] += self.momentum * m_new - self.lr * grad
        else:
            value[index] += m_new

    def _adam(self, value: np.ndarray, grad: np.ndarray, rows: np.ndarray | None) -> None:
        t = self.iterations + 1
        lr = self.lr * math.sqrt(1 - self.beta_2 ** t) / (1 - self.beta_1 ** t)
        m, v = self.slots["m"], self.slots["v"]
        if rows is None:
            # In place, one temporary: a dense update of a large table is memory-bound.
            m *= self.beta_1
            m += (1 - self.beta_1) * grad
            v *= self.beta_2
            v += (1 - self.beta_2) * np.square(grad)
            step = np.sqrt(v, out=np.empty_like(v))  # an array for a scalar variable too
            step += self.epsilon
            np.divide(m, step, out=step)
            step *= lr
            value -= step
            return
        # Lazy rows: in place on gathered copies, one temporary (cost follows the rows).
        m_rows = np.take(m, rows, axis=0)   # faster than m[rows] for a gather of rows
        m_rows -= grad
        m_rows *= self.beta_1
        m_rows += grad                       # beta_1 * m + (1 - beta_1) * g
        square = np.square(grad)
        v_rows = np.take(v, rows, axis=0)
        v_rows -= square
        v_rows *= self.beta_2
        v_rows += square                     # beta_2 * v + (1 - beta_2) * g^2
        m[rows] = m_rows
        v[rows] = v_rows
        step = np.sqrt(v_rows, out=square)
        step += self.epsilon
        np.divide(m_rows, step, out=step)
        step *= lr
        np.subtract(np.take(value, rows, axis=0), step, out=step)
        value[rows] = step
