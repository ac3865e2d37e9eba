"""The seam: the only place where stratax touches private parts of Keras and JAX.

Everything else in stratax uses public Keras and JAX API. What is hooked (replaced, read or
written), what for, and which stratax module relies on it:

- ``keras.Model.{fit, evaluate, predict, train_on_batch, test_on_batch, predict_on_batch}``
  and ``Trainer.compile`` (replaced): a model bound to a strategy runs its calls through the
  strategy's Keras runner. -> ``keras.methods``
- ``keras.Model.{save, save_weights}`` (replaced): atomic, chief-only saves. -> ``keras.saving``
- ``keras.Model.load_weights`` (replaced): the optimizer is built first, so its saved state
  loads (as TensorFlow restores slots). -> ``keras.saving``
- ``keras.src.backend.jax.core.should_shard_at_init`` (wrapped): a variable split over several
  processes built shard by shard, never whole in one process. -> ``keras.model_parallel``
- ``keras.Model.get_weights`` (replaced), and ``Variable._value`` (read and written, by saves
  too): state held in parts by several processes gathered whole for the call, when it fits.
  -> ``keras.saving``, ``keras.model_parallel``
- ``keras.Model.reset_metrics`` (replaced): resets of mirrored metrics placed without a
  cross-process check. -> ``keras.steps.metric_reset``
- ``Trainer._get_metrics_result_or_logs`` (replaced): an epoch's logs taken from the last
  train step's, when they are Keras' own results of the metric values the model now holds.
  -> ``keras.steps.epoch_logs``
- ``JAXTrainer._make_function`` (replaced): the runner decides how a group of
  ``steps_per_execution`` steps runs. -> ``keras.runners.runner``
- ``JAXEpochIterator._get_iterator`` (replaced) and its ``data_adapter`` (read): the runner
  feeds the epoch's batches, placed on the replicas. -> ``keras.call_stack``
- ``PyDatasetAdapter.py_dataset`` (read): finding stratax's feed behind Keras' epoch iterator.
  -> ``keras.call_stack``
- ``py_dataset_adapter.OrderedEnqueuer`` (made and run): a ``PyDataset``'s ``workers`` and
  ``use_multiprocessing`` honoured, its batches read by Keras' own thread or process pool in
  the order stratax gives. -> ``keras.feed_sources``
- ``array_slicing.train_validation_split``: ``validation_split`` cut exactly as Keras cuts it.
  -> ``keras.feed``
- ``data_adapter_utils.class_weight_to_sample_weights``: ``class_weight`` exactly as Keras
  weighs it. -> ``keras.feed``, ``keras.feed_sources``
- ``data_adapter_utils.check_data_cardinality``: arrays of different lengths refused with
  Keras' own message. -> ``keras.feed``
- ``rng_utils.get_random_seed``: the seed of ``keras.utils.set_random_seed`` (no public
  getter). -> ``keras.feed``, ``keras.seeds``
- ``global_state``'s ``global_seed_generator`` (read): Keras' global ``SeedGenerator`` if one
  exists (``keras.random``'s getter creates one), its state agreed by the workers.
  -> ``keras.seeds``
- ``Distribution._is_multi_process`` (written, ``False``): Keras 3.10 refuses every input but
  ``tf.data`` under a distribution over several processes, while stratax feeds every process
  its own batches. -> ``keras.distribution``, ``keras.model_parallel``
- ``data_adapters.get_data_adapter`` and its ``is_tf_dataset``/``is_grain_dataset``/
  ``is_torch_dataloader`` (called), grain's ``DataLoader._shard_options`` (read): ``tf.data``,
  grain and ``torch.utils.data.DataLoader`` inputs read through Keras' own adapters, a fresh
  pass per epoch, and a grain loader's own sharding recognised. -> ``keras.feed``
- TensorFlow's ``_AutoShardDataset``, ``compute_batch_size``, ``batch_sizes_for_worker`` and
  ``Dataset._as_serialized_graph`` (called): a ``tf.data`` pipeline sharded by file as
  ``tf.distribute`` shards it. -> ``keras.feed``
- ``jax_trainer._distribute_data``: placing batches of inputs stratax leaves to Keras (e.g.
  ``tf.data``) as Keras would. -> ``keras.runners.mesh_runner``
- ``model._symbolic_build``, ``model._flatten_layers``, ``model._compile_metrics`` and
  ``model._compile_loss`` (read): building a model from a batch the feed
  leaves in place (Keras' own build reads one from the epoch iterator, which loses it from a
  generator). -> ``keras.methods``
- ``BatchNormalization._moments`` (overridden in a subclass): batch statistics combined over
  the replicas inside ``strategy.run``. -> ``keras.sync_batch_norm``
- ``JAXTrainer._update_metrics_variables`` (called, by ``update_metrics``): Keras' own metric
  update of a train step (loss tracker and compiled metrics), split from the optimizer step: run
  on a worker without Keras' local optimizer step (-> ``keras.steps.ps_steps``), and before the
  packed all-reduce of gradients and metric updates (-> ``keras.steps.packed_step``).
- ``keras.layers.Embedding.call`` (wrapped once; unchanged unless this thread sets a lookup):
  a plain embedding's ``take`` replaced by the rows a worker pulled (row-sparse path under
  ``ParameterServerStrategy``). -> ``keras.steps.ps_steps``
- ``distribution_lib.distribute_tensor`` of Keras' JAX backend (wrapped once; unchanged unless
  this thread sets a placement): how a Keras variable under a layout takes a new value, here
  metric resets placed without JAX's cross-process equality check. -> ``keras.steps.metric_reset``
- ``JaxVariable._initialize_with_initializer`` (wrapped once; unchanged unless this thread
  decides otherwise), ``Variable._value``/``_initialize_layout`` and the variable's class
  (written: a subclass whose reads never build the value; ``jax._src.core.trace_state_clean``
  tells traced reads, which get a stand-in): a large variable under
  ``ParameterServerStrategy`` built by its servers, never on the chief.
  -> ``keras.runners.ps_runner``, ``keras.shard_recipes``
- ``KerasVariable.__init__`` (wrapped once; unchanged unless this thread observes): the
  keyword arguments of TensorFlow's variables that Keras does not take (``per_worker_variable``)
  taken out and handed to the strategy, so ``keras.Variable(..., per_worker_variable=True)``
  under ``ParameterServerStrategy.scope()`` makes a per-worker variable; and each variable
  built inside a strategy's ``scope()`` recorded as that strategy's, for
  ``strategy.extended.variable_created_in_scope``.
  -> ``keras.runners.ps_runner``, ``keras.install``
- ``Variable._value`` (read) and ``model._jax_state``/``_jax_state_synced`` (written): after a
  failed call, which variables Keras left purged (``None``) and its pending step state
  dropped, so that the model holds its last completed step. -> ``keras.failed_calls``
- ``model._initial_epoch`` (written): Keras' own resume hook, the epoch ``fit`` starts at after
  a restore. -> ``keras.callbacks.backup``
- ``jax._src.ffi.FfiEffect`` (read) and ``Jaxpr.replace`` / ``JaxprEqn.replace`` (called): a
  traced ``strategy.run`` program rewritten so that its one shared-memory all-reduce is not
  side-effecting, which lets JAX dispatch the program from its C++ fast path.
  -> ``runtime.shm_calls``
- ``jax._src.xla_bridge.backends_are_initialized``: whether JAX started (the CPU device count
  is then fixed). -> ``startup``, ``runtime.devices``
- ``jax._src.distributed.global_state.client``: which processes the coordination service still
  sees. -> ``runtime.distributed``
- ``jax._src.xla_bridge.register_backend_factory``, ``make_cpu_client`` and
  ``jax._src.lib._jax.make_gloo_tcp_collectives``: gloo bound to the address that routes to a
  coordinator on another host (JAX has no public option). -> ``runtime.distributed``

Each private import happens inside the function that needs it, so importing this module costs
nothing. :func:`check_versions` refuses Keras and JAX versions outside the tested range, where
any of the hooks above may have moved.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

from stratax._src.core import env

# The ranges the test suite runs on (.ci/run: the newest releases on Python 3.11, and Python
# 3.12 with the newest JAX and the oldest Keras claimed). Keep in step with pyproject.toml.
TESTED_RANGES = {
    "keras": ((3, 10), (3, 16)),   # >=3.10, <3.16
    "jax": ((0, 10), (0, 13)),     # >=0.10, <0.13
}
_HOOKED = "_stratax_hooked"


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def version_problems(installed: dict[str, str] | None = None) -> list[str]:
    """What is installed outside :data:`TESTED_RANGES` (empty when everything is in range)."""
    problems = []
    for package, (low, high) in TESTED_RANGES.items():
        version = (installed or {}).get(package) or metadata.version(package)
        release = _release(version)
        if not low <= release[: len(low)] < high:
            wanted = f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
            problems.append(f"{package} {version} (stratax is tested with {package}{wanted})")
    return problems


def check_versions() -> None:
    """Fails clearly when Keras or JAX is outside the range stratax was tested with.

    Set ``STRATAX_SKIP_VERSION_CHECK=1`` to try another version at your own risk.

    Raises:
        RuntimeError: a version outside the tested range.
    """
    if os.environ.get(env.STRATAX_SKIP_VERSION_CHECK):
        return
    problems = version_problems()
    if problems:
        raise RuntimeError(
            "stratax hooks into Keras and JAX internals that move between releases; found "
            + "; ".join(problems)
            + ". Install a tested version, e.g. `pip install \"keras>=3.10,<3.16\" "
            "\"jax>=0.10,<0.13\"`, or set STRATAX_SKIP_VERSION_CHECK=1 to try anyway."
        )


# --------------------------------------------------------------------------- Keras: hooks
def install_keras_hooks(
    *,
    model_method: Callable[[str, Callable[..., Any]], Callable[..., Any]],
    save_method: Callable[[Callable[..., Any]], Callable[..., Any]],
    load_weights_method: Callable[[Callable[..., Any]], Callable[..., Any]],
    get_weights_method: Callable[[Callable[..., Any]], Callable[..., Any]],
    reset_metrics_method: Callable[[Callable[..., Any]], Callable[..., Any]],
    metrics_result_or_logs_method: Callable[[Callable[..., Any]], Callable[..., Any]],
    make_step: Callable[[Any, Callable[..., Any], Callable[..., Any]], Callable[..., Any]],
    epoch_batches: Callable[[Any, Callable[[], Iterator[Any]]], Iterator[Any]],
) -> None:
    """Replaces the Keras methods of the table above (once; later calls do nothing).

    Args:
        model_method: ``(name, original) -> replacement`` for the public ``Model`` methods.
        save_method: ``original -> replacement`` for ``save`` and ``save_weights``.
        load_weights_method: ``original -> replacement`` for ``load_weights``.
        get_weights_method: ``original -> replacement`` for ``get_weights``.
        reset_metrics_method: ``original -> replacement`` for ``reset_metrics``.
        metrics_result_or_logs_method: ``original -> replacement`` for
            ``_get_metrics_result_or_logs`` (an epoch's or an evaluation's final logs).
        make_step: ``(model, build, step_function) -> iterator_step``, where ``build(step)`` is
            Keras' own ``_make_function`` for ``step``.
        epoch_batches: ``(data_adapter, keras_iterator) -> iterator`` of one pass of batches,
            where ``keras_iterator()`` is Keras' own.
    """
    import keras
    from keras.src.backend.jax import trainer as jax_trainer
    from keras.src.trainers import trainer as base_trainer

    trainer = jax_trainer.JAXTrainer
    if getattr(trainer, _HOOKED, False):
        return
    for name in ("compile", "fit", "evaluate", "predict", "train_on_batch", "test_on_batch",
                 "predict_on_batch"):
        # ``compile`` is replaced where Keras defines it, so that Keras' check for a model with
        # its own ``compile`` (``cls.compile != Trainer.compile``) still sees the stock one.
        owner = base_trainer.Trainer if name == "compile" else keras.Model
        setattr(owner, name, model_method(name, getattr(owner, name)))
    for name in ("save", "save_weights"):
        setattr(keras.Model, name, save_method(getattr(keras.Model, name)))
    keras.Model.get_weights = get_weights_method(keras.Model.get_weights)
    keras.Model.load_weights = load_weights_method(keras.Model.load_weights)
    keras.Model.reset_metrics = reset_metrics_method(keras.Model.reset_metrics)
    base_trainer.Trainer._get_metrics_result_or_logs = metrics_result_or_logs_method(
        base_trainer.Trainer._get_metrics_result_or_logs)

    original_make_function = trainer._make_function

    @functools.wraps(original_make_function)
    def _make_function(self: Any, step_function: Callable[..., Any], *args: Any,
                       **kwargs: Any) -> Any:
        def build(step: Callable[..., Any]) -> Any:
            return original_make_function(self, step, *args, **kwargs)

        return make_step(self, build, step_function)

    trainer._make_function = _make_function

    iterator_class = jax_trainer.JAXEpochIterator
    original_get_iterator = iterator_class._get_iterator

    @functools.wraps(original_get_iterator)
    def _get_iterator(self: Any) -> Iterator[Any]:
        return epoch_batches(self.data_adapter, lambda: original_get_iterator(self))

    iterator_class._get_iterator = _get_iterator
    _shard_split_variables_at_init()
    setattr(trainer, _HOOKED, True)


def _shard_split_variables_at_init() -> None:
    """Makes Keras build a variable that its layout splits over several processes shard by
    shard, each process only its own (Keras does that only for variables of 250 MB or more;
    otherwise each process builds the whole value, and JAX's placement gathers it all again
    to check that the processes agree). Keras releases without ``should_shard_at_init``
    (3.10) keep building whole values: correct, with more memory at creation."""
    from keras.src.backend.jax import core as jax_core

    original = getattr(jax_core, "should_shard_at_init", None)
    if original is None:
        return

    @functools.wraps(original)
    def should_shard_at_init(init_layout: Any, shape: Any) -> bool:
        split_over_processes = (not getattr(init_layout, "is_fully_addressable", True)
                                and not getattr(init_layout, "is_fully_replicated", True))
        return split_over_processes or original(init_layout, shape)

    jax_core.should_shard_at_init = should_shard_at_init


# --------------------------------------------------------------------------- Keras: helpers
def train_validation_split(arrays: tuple[Any, ...], validation_split: float) -> tuple[Any, Any]:
    """Keras' own cut of ``(x, y, sample_weight)`` for ``validation_split``."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


def class_weight_to_sample_weights(y: Any, class_weight: dict[int, float]) -> Any:
    """Keras' own translation of ``class_weight`` into per-example weights."""
    from keras.src.trainers.data_adapters import data_adapter_utils

    return data_adapter_utils.class_weight_to_sample_weights(y, class_weight)


def check_data_cardinality(arrays: tuple[Any, ...]) -> None:
    """Keras' own check that ``(x, y, sample_weight)`` have one length (its ``ValueError``,
    "Data cardinality is ambiguous", naming each one's sizes)."""
    from keras.src.trainers.data_adapters import data_adapter_utils

    data_adapter_utils.check_data_cardinality(arrays)


def keras_random_seed() -> int | None:
    """The seed given to ``keras.utils.set_random_seed``, or ``None``."""
    from keras.src.utils import rng_utils

    return rng_utils.get_random_seed()


def keras_global_seed_generator() -> Any:
    """Keras' global ``SeedGenerator`` (unseeded ``keras.random`` calls), or ``None`` if none
    was made yet."""
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    return global_state.get_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR)


def accepts_stratax_feeds(distribution: Any) -> Any:
    """``distribution`` (a Keras one, built with ``auto_shard_dataset=False``), no longer
    refusing input that is not a ``tf.data.Dataset`` in a multi-process job.

    stratax feeds every process its own batches (``keras.feed``). Keras 3.10 refuses any input
    but a ``tf.data.Dataset`` when the distribution spans processes; newer releases only when it
    also shards datasets itself. Nothing else reads the flag once the distribution is built
    (sharding a dataset is off).
    """
    distribution._is_multi_process = False
    return distribution


def is_keras_dataset(x: Any) -> bool:
    """True for a ``tf.data`` dataset, a grain dataset or loader, or a torch ``DataLoader``:
    the inputs Keras reads through data adapters of their own."""
    from keras.src.trainers import data_adapters

    # Releases before Keras' grain adapter read a grain dataset as any re-iterable.
    is_grain = getattr(data_adapters, "is_grain_dataset", lambda _: False)
    return bool(data_adapters.is_tf_dataset(x) or is_grain(x)
                or data_adapters.is_torch_dataloader(x))


def is_tf_dataset(x: Any) -> bool:
    """True for a ``tf.data.Dataset`` (Keras' test, without importing Keras or TensorFlow)."""
    return any(parent.__name__ == "DatasetV2" and "tensorflow.python." in parent.__module__
               for parent in type(x).__mro__)


def keras_data_adapter(x: Any, class_weight: dict[int, float] | None) -> Any:
    """Keras' own data adapter of ``x``, with Keras' checks of ``class_weight`` (and its
    translation, for ``tf.data``)."""
    from keras.src.trainers import data_adapters

    return data_adapters.get_data_adapter(x, class_weight=class_weight)


def grain_loader_shards(x: Any) -> bool:
    """Whether ``x`` is a grain ``DataLoader`` that reads only a shard of its records
    (``shard_options`` such as ``grain.sharding.ShardByJaxProcess``)."""
    options = getattr(x, "_shard_options", None)
    return (type(x).__name__ == "DataLoader" and "grain" in type(x).__module__
            and int(getattr(options, "shard_count", 1)) > 1)


# TensorFlow's reader datasets, the sources its FILE auto-shard policy shards
# (tensorflow/core/grappler/optimizers/data/auto_shard.cc, kReaderDatasetOps).
_TF_READER_OPS = frozenset({
    "ArrayRecordDataset", "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2",
    "RecordIODataset", "SSTableDataset", "TextLineDataset", "TFRecordDataset",
    "TFRecordDatasetV2",
})


def tf_dataset_reads_files(dataset: Any) -> bool:
    """Whether a ``tf.data`` pipeline reads files (TensorFlow's FILE policy can shard it)."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return any(node.op in _TF_READER_OPS for node in nodes)


def tf_dataset_shard_files(dataset: Any, num_workers: int, index: int) -> Any:
    """Worker ``index``'s part of ``dataset`` as ``tf.distribute`` cuts it by file: each
    global batch rebatched into ``num_workers`` parts, and only this worker's files read.

    Raises:
        ValueError: the pipeline's batch size cannot be found (no ``batch`` op).
    """
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import distribute

    batch_size = int(distribute.compute_batch_size(dataset))
    if batch_size < 0:
        raise ValueError(
            "Sharding a tf.data pipeline by file needs its global batch size, and none was "
            "found: end the pipeline with `.batch(global_batch_size)`, or shard it yourself "
            "and set `options.experimental_distribute.auto_shard_policy = "
            "tf.data.experimental.AutoShardPolicy.OFF`."
        )
    parts = distribute.batch_sizes_for_worker(batch_size, num_workers, 1, index)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.FILE)
    rebatched = dataset.rebatch(parts).with_options(options)
    return distribute._AutoShardDataset(rebatched, num_workers, index, num_workers)


def distribute_data(batch: Any, layouts: Any) -> Any:
    """Places ``batch`` with Keras' data layouts, as Keras' JAX trainer does."""
    from keras.src.backend.jax import trainer as jax_trainer

    return jax_trainer._distribute_data(batch, layouts)


def ordered_enqueuer(py_dataset: Any, workers: int, use_multiprocessing: bool,
                     max_queue_size: int, name: str) -> Any:
    """Keras' ``OrderedEnqueuer`` of ``py_dataset`` (not shuffled), the reader Keras' own
    ``PyDataset`` adapter starts when the dataset asks for workers; its processes, with
    ``use_multiprocessing``, come from ``forkserver`` (see ``_forkserver_enqueuer``). ``name``
    names the user's dataset in errors."""
    from keras.src.trainers.data_adapters import py_dataset_adapter

    if not use_multiprocessing:
        return py_dataset_adapter.OrderedEnqueuer(py_dataset, workers=workers,
                                                  max_queue_size=max_queue_size, shuffle=False)
    enqueuer = _forkserver_enqueuer()(py_dataset, workers=workers, use_multiprocessing=True,
                                      max_queue_size=max_queue_size, shuffle=False)
    enqueuer.dataset_name = name
    return enqueuer


def importing_main_for_a_child() -> bool:
    """True while multiprocessing re-imports the main script in a child or forkserver process
    (``spawn``/``forkserver`` start methods), where a script's top-level code must not run."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


# How long the first worker process of a PyDataset may take to start (import its modules).
PYDATASET_WORKER_START_SECONDS = 120.0

_MAIN_GUARD = ("They start from multiprocessing's 'forkserver', which imports the main script and "
               "receives the dataset by pickling: put the script's training under `if __name__ "
               "== \"__main__\":`, define the dataset's class at the top level of a module or "
               "of the script, or read it in threads (use_multiprocessing=False).")


@functools.cache
def _forkserver_enqueuer() -> type:
    """Keras' ``OrderedEnqueuer`` whose process pool starts from multiprocessing's
    ``forkserver`` instead of a ``fork`` of this process.

    Keras' pool forks the training process (the ``fork`` default of Python <= 3.13 on Linux);
    JAX runs threads, and a fork of a process with threads can deadlock in the child (JAX
    warns). ``forkserver``, Python 3.14's default, forks workers from a clean server process
    that imports ``__main__`` and this module's Keras once, so the dataset is pickled to the
    workers and a script's training must sit under ``if __name__ == "__main__":``, as on macOS.
    A pickling failure, or workers that die starting (a script that trains at import), is an
    error naming the fix instead of a hang.
    """
    import multiprocessing
    import multiprocessing.pool
    import queue
    import time

    from keras.src.trainers.data_adapters import py_dataset_adapter as adapter

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", "stratax._src.keras.feed"])

    class _CountedPool(multiprocessing.pool.Pool):
        """A pool that counts the processes it starts: it replaces a worker that died
        starting, endlessly, so more starts than workers mean they die."""

        starts = 0

        def Process(self, ctx: Any, *args: Any, **kwargs: Any) -> Any:
            self.starts += 1
            return ctx.Process(*args, **kwargs)

    class _ForkserverEnqueuer(adapter.OrderedEnqueuer):
        dataset_name = "the PyDataset"

        def _get_executor_init(self, workers: int) -> Callable[[Any], Any]:
            def pool_fn(shared: Any) -> Any:
                name = self.dataset_name
                if importing_main_for_a_child():  # this is a worker, running the script
                    raise RuntimeError(f"The worker processes of {name} run the main script's "
                                       f"training. {_MAIN_GUARD}")
                started = context.Queue()
                try:
                    pool = _CountedPool(workers, initializer=adapter.init_pool_generator,
                                        initargs=(shared, None, started), context=context)
                except Exception as error:  # pickle's (and a dead server's) have no common type
                    raise ValueError(f"Starting the worker processes of {name} failed: "
                                     f"{error}. {_MAIN_GUARD}") from error
                adapter._DATA_POOLS.add(pool)
                deadline = time.monotonic() + PYDATASET_WORKER_START_SECONDS
                while pool.starts <= workers and time.monotonic() < deadline:
                    try:
                        started.get(timeout=0.2)
                        return pool
                    except queue.Empty:
                        pass
                pool.terminate()
                how = ("died while starting" if pool.starts > workers else
                       f"did not start within {PYDATASET_WORKER_START_SECONDS:g} s")
                raise RuntimeError(f"The worker processes of {name} {how}. {_MAIN_GUARD}")

            return pool_fn

    return _ForkserverEnqueuer


def adapter_dataset(data_adapter: Any) -> Any:
    """The ``PyDataset`` behind one of Keras' data adapters, or ``None``."""
    return getattr(data_adapter, "py_dataset", None)


def build_for(model: Any, method: str, batch: Callable[[], Any]) -> None:
    """Builds ``model`` (and its compiled loss and metrics) from one batch, as Keras would.

    Keras builds an unbuilt model by reading one batch from its epoch iterator; stratax builds
    it first from a batch its feed leaves in place, so no batch of a generator is lost.
    ``batch()`` is called only when something is unbuilt, as Keras reads a batch only then (a
    ``tf.data`` pipeline's extra pass would change the order of its reshuffles).
    """
    import keras

    unbuilt = not all(layer.built for layer in model._flatten_layers())
    if method == "predict":
        if unbuilt:
            data = batch()
            x = data[0] if isinstance(data, tuple) else data
            with keras.StatelessScope():
                model(x)
        return
    parts = (getattr(model, "_compile_metrics", None), getattr(model, "_compile_loss", None))
    needs_data = unbuilt or any(part is not None and not part.built for part in parts)
    if needs_data or getattr(model, "compiled", False):  # the optimizer builds without data
        model._symbolic_build(data_batch=batch() if needs_data else None)


def batch_normalization_with_moments(
    combine: Callable[[Any, Any], tuple[Any, Any]],
) -> type:
    """A ``keras.layers.BatchNormalization`` subclass whose batch moments pass through ``combine``.

    ``combine(mean, variance) -> (mean, variance)`` sees the moments Keras computed over the
    layer's own batch and returns the ones to normalise with (and to update the moving
    statistics with).
    """
    import keras

    class BatchNormalizationWithMoments(keras.layers.BatchNormalization):
        def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
            return combine(*super()._moments(inputs, mask))

    return BatchNormalizationWithMoments


def update_metrics(model: Any, metrics_variables: Any, unscaled_loss: Any, x: Any, y: Any,
                   y_pred: Any, sample_weight: Any) -> tuple[Any, Any]:
    """``(logs, new metrics_variables)``: Keras' JAX ``train_step`` metric update, statelessly."""
    return model._update_metrics_variables(metrics_variables, unscaled_loss, x, y, y_pred,
                                           sample_weight)


_embedding_lookup = threading.local()


@contextlib.contextmanager
def embedding_lookups(lookup: Callable[[Any, Any], Any]) -> Iterator[None]:
    """While active in this thread, a plain ``keras.layers.Embedding`` (not quantized, no
    LoRA) computes ``lookup(layer, int_ids)`` instead of ``take(layer.embeddings, ids)``;
    ``lookup`` returns ``None`` to keep Keras' own lookup."""
    import keras

    embedding = keras.layers.Embedding
    if not getattr(embedding, _HOOKED, False):
        original = embedding.call

        @functools.wraps(original)
        def call(self: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            active = getattr(_embedding_lookup, "fn", None)
            if active is not None and not args and not kwargs and not self.quantization_mode \
                    and not self.lora_enabled:
                ids = inputs
                if keras.backend.standardize_dtype(ids.dtype) not in ("int32", "int64"):
                    ids = keras.ops.cast(ids, "int32")
                outputs = active(self, ids)
                if outputs is not None:
                    return keras.ops.cast(outputs, self.compute_dtype)
            return original(self, inputs, *args, **kwargs)

        embedding.call = call
        setattr(embedding, _HOOKED, True)
    with _set_in_thread(_embedding_lookup, lookup):
        yield


_variable_placement = threading.local()


@contextlib.contextmanager
def variable_placement(place: Callable[[Any, Any], Any]) -> Iterator[None]:
    """While active in this thread, a Keras variable with a layout takes a new value through
    ``place(value, sharding)``; ``place`` returns ``None`` to keep Keras' own placement."""
    from keras.src.backend.jax import distribution_lib

    if not getattr(distribution_lib, _HOOKED, False):
        original = distribution_lib.distribute_tensor

        @functools.wraps(original)
        def distribute_tensor(tensor: Any, layout: Any) -> Any:
            active = getattr(_variable_placement, "fn", None)
            if active is not None:
                placed = active(tensor, getattr(layout, "backend_layout", layout))
                if placed is not None:
                    return placed
            return original(tensor, layout)

        distribution_lib.distribute_tensor = distribute_tensor
        setattr(distribution_lib, _HOOKED, True)
    with _set_in_thread(_variable_placement, place):
        yield


_variable_building = threading.local()
_remote_classes: dict[type, type] = {}


@contextlib.contextmanager
def variables_built_elsewhere(decide: Callable[[Any, Any], Any]) -> Iterator[None]:
    """While active in this thread, a Keras variable made from an initializer is not built
    here when ``decide(variable, initializer)`` says so (returns anything but ``None``): it
    then holds no value, traced code reads a stand-in of its shape, and eager reads
    (``numpy()``, ``get_weights``, saving) raise ``ValueError`` naming the variable, its size
    and ``strategy.save_checkpoint``."""
    from keras.src.backend.jax import core as jax_core

    variable_class = jax_core.JaxVariable
    if _HOOKED not in vars(variable_class):  # its base class may carry another hook's mark
        original = variable_class._initialize_with_initializer

        @functools.wraps(original)
        def _initialize_with_initializer(self: Any, initializer: Any) -> None:
            active = getattr(_variable_building, "fn", None)
            description = None if active is None else active(self, initializer)
            if description is None:
                original(self, initializer)
                return
            self._initialize_layout()
            self._value = None
            self.__class__ = _remote_class(type(self))

        variable_class._initialize_with_initializer = _initialize_with_initializer
        setattr(variable_class, _HOOKED, True)
    with _set_in_thread(_variable_building, decide):
        yield


def _remote_class(base: type) -> type:
    """``base`` with reads that never build the value (see ``variables_built_elsewhere``)."""
    cached = _remote_classes.get(base)
    if cached is not None:
        return cached
    import jax
    import numpy as np
    from jax._src import core as jax_core_internal
    from keras.src.backend.common.stateless_scope import get_stateless_scope, in_stateless_scope

    def refuse(self: Any) -> ValueError:
        gib = int(np.prod(self._shape, dtype=np.int64)) * np.dtype(self._dtype).itemsize / 2**30
        return ValueError(
            f"Variable {self.path!r} of shape {tuple(self._shape)} ({gib:.2f} GiB) lives on the "
            "parameter servers, built there shard by shard: no process holds it whole, so it "
            "cannot be read, assigned or saved here. Save it with "
            "strategy.save_checkpoint(path) and read rows with "
            "strategy.place_variables(variable).sparse_read(ids); or set "
            "sx.config.update('ps_build_on_servers_bytes', 0) before building the model to "
            "keep every variable on the chief.")

    def value(self: Any) -> Any:
        if in_stateless_scope():
            current = get_stateless_scope().get_current_value(self)
            if current is not None:
                return self._maybe_autocast(current)
        if not jax_core_internal.trace_state_clean():  # traced: a stand-in of its shape
            return self._maybe_autocast(jax.numpy.zeros(self._shape, self._dtype))
        # Eager, as Keras' JAX trainer collects its state: a description, never an array.
        return jax.ShapeDtypeStruct(tuple(self._shape), self._dtype,
                                    sharding=jax.sharding.SingleDeviceSharding(
                                        jax.devices()[0]))

    def assign(self: Any, new_value: Any) -> Any:
        if isinstance(new_value, jax.ShapeDtypeStruct):  # the trainer giving its state back
            return new_value
        if in_stateless_scope() or not jax_core_internal.trace_state_clean():
            return base.assign(self, new_value)
        raise refuse(self)

    def numpy(self: Any) -> Any:
        raise refuse(self)

    def array(self: Any, dtype: Any = None, copy: Any = None) -> Any:
        raise refuse(self)

    remote = type(f"Remote{base.__name__}", (base,), {
        "value": property(value), "assign": assign, "numpy": numpy, "__array__": array,
        "__module__": __name__})
    _remote_classes[base] = remote
    return remote


_variable_options = threading.local()
_variable_created = threading.local()
# TensorFlow's ``tf.Variable`` keyword arguments that Keras' ``Variable`` does not take.
TF_VARIABLE_OPTIONS = ("per_worker_variable",)


def _hook_variable_init() -> None:
    """Wraps ``KerasVariable.__init__`` once: it hands the ``TF_VARIABLE_OPTIONS`` to this
    thread's ``keras_variable_options`` observer and the built variable to this thread's
    ``keras_variables_created`` recorder; with neither active it is Keras' own."""
    from keras.src.backend.common import KerasVariable

    if _HOOKED in vars(KerasVariable):
        return
    original = KerasVariable.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        active = getattr(_variable_options, "fn", None)
        options = ({k: kwargs.pop(k) for k in TF_VARIABLE_OPTIONS if k in kwargs}
                   if active is not None else {})
        original(self, *args, **kwargs)
        if options:
            active(self, options)
        record = getattr(_variable_created, "fn", None)
        if record is not None:
            record(self)

    KerasVariable.__init__ = __init__
    setattr(KerasVariable, _HOOKED, True)


@contextlib.contextmanager
def keras_variable_options(observe: Callable[[Any, dict[str, Any]], None]) -> Iterator[None]:
    """While active in this thread, the ``TF_VARIABLE_OPTIONS`` given to a Keras variable's
    constructor are taken out of its arguments (Keras would drop or refuse them) and passed to
    ``observe(variable, options)`` once Keras has built the variable."""
    _hook_variable_init()
    with _set_in_thread(_variable_options, observe):
        yield


@contextlib.contextmanager
def keras_variables_created(record: Callable[[Any], None]) -> Iterator[None]:
    """While active in this thread, ``record(variable)`` is called with each Keras variable
    once Keras has built it (``scope()`` records which strategy created a variable)."""
    _hook_variable_init()
    with _set_in_thread(_variable_created, record):
        yield


@contextlib.contextmanager
def _set_in_thread(slot: threading.local, fn: Callable[..., Any]) -> Iterator[None]:
    """Makes ``fn`` the function a hook reads from ``slot`` in this thread, for the block."""
    previous = getattr(slot, "fn", None)
    slot.fn = fn
    try:
        yield
    finally:
        slot.fn = previous


def held_value(variable: Any) -> Any:
    """The array ``variable`` holds, or ``None`` where Keras' JAX trainer purged it for the
    length of a call (``variable.value`` would then fail: it re-runs a dropped initializer) or
    where ``variable`` is no Keras variable (a stand-in holding NumPy values)."""
    return getattr(variable, "_value", None)


def drop_pending_state(model: Any) -> None:
    """Forgets the step state Keras' JAX trainer keeps for a later sync (``_jax_state``), so
    that no later sync puts a failed call's state over the model's variables."""
    model._jax_state = None
    model._jax_state_synced = True


def set_initial_epoch(model: Any, epoch: int) -> None:
    """Makes the running ``fit`` start at ``epoch`` (Keras' ``BackupAndRestore`` does the same)."""
    model._initial_epoch = epoch


# --------------------------------------------------------------------------- JAX
def jax_backends_initialized() -> bool:
    """True once JAX has initialised its backends (device counts are then fixed)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def distributed_client() -> Any:
    """The ``jax.distributed`` coordination-service client, or ``None`` (no public accessor)."""
    from jax._src import distributed as jax_distributed

    return jax_distributed.global_state.client



def ffi_calls_without_side_effect(jaxpr: Any, *target_names: str) -> Any | None:
    """``jaxpr`` (a ``Jaxpr``) with its ``ffi_call``s of ``target_names`` not side-effecting.

    Returns ``None`` when another side-effecting FFI call shares JAX's FFI effect with them
    (the effect must then stay). Only the jaxprs that evaluating ``jaxpr`` runs are rewritten
    (bodies of loops, branches, calls); rules for differentiation are left as they are.
    """
    from jax._src import core, ffi

    def effectful(eqn: Any) -> bool:
        return eqn.primitive.name == "ffi_call" and eqn.params.get("has_side_effect", False)

    def others(j: Any) -> bool:
        return any((effectful(e) and e.params.get("target_name") not in target_names)
                   or any(others(sub) for sub in jaxprs_in_params(e.params.values()))
                   for e in j.eqns)

    def without(effects: Any) -> Any:
        return effects - {e for e in effects if isinstance(e, ffi.FfiEffect)}

    def param(value: Any) -> Any:
        if isinstance(value, core.ClosedJaxpr):
            return value.replace(jaxpr=rewrite(value.jaxpr))
        if isinstance(value, core.Jaxpr):
            return rewrite(value)
        if type(value) in (tuple, list):  # not a NamedTuple of settings
            return type(value)(param(item) for item in value)
        return value

    def rewrite(j: Any) -> Any:
        eqns = []
        for eqn in j.eqns:
            params = {name: param(value) for name, value in eqn.params.items()}
            if effectful(eqn):
                params["has_side_effect"] = False
            eqns.append(eqn.replace(params=params, effects=without(eqn.effects)))
        return j.replace(eqns=eqns, effects=without(j.effects))

    if others(jaxpr):
        return None
    return rewrite(jaxpr)


def jaxprs_in_params(values: Any) -> Iterator[Any]:
    """The jaxprs (as open ``Jaxpr``s) among an equation's parameter ``values``, tuples and
    lists searched: the bodies, branches and callees that evaluating the equation runs."""
    from jax.extend import core

    for value in values:
        if isinstance(value, core.ClosedJaxpr):
            yield value.jaxpr
        elif isinstance(value, core.Jaxpr):
            yield value
        elif type(value) in (tuple, list):  # not a NamedTuple of settings
            yield from jaxprs_in_params(value)


def use_gloo_on_address(address: str) -> None:
    """Makes gloo listen on, and advertise, ``address`` instead of what the host name resolves to.

    Re-registers JAX's CPU backend factory with gloo's TCP collectives bound to ``address``;
    must run before the CPU backend starts.
    """
    from jax._src import distributed as jax_distributed
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    def make_client() -> Any:
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=jax_distributed.global_state.client, hostname=address)
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", make_client, priority=0, fail_quietly=False)


def keras_gradients_and_metrics(model: Any, trainable: Any, non_trainable: Any,
                                optimizer_vars: Any, metrics_vars: Any, data: Any
                                ) -> tuple[Any, Any, Any]:
    """The first half of Keras' JAX ``train_step``: gradients, before the optimizer applies them.

    Returns ``(grads, non_trainable, metrics_vars)``: the loss's gradients with respect to
    ``trainable`` and the non-trainable and metric variables updated by the forward pass, the
    loss and ``compute_metrics``, exactly as ``JAXTrainer.train_step`` computes them (it
    updates metrics after applying the gradients, from values that do not depend on them).
    """
    import jax
    import keras

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
    (_, aux), grads = grad_fn(trainable, non_trainable, metrics_vars, x, y, sample_weight,
                              training=True, optimizer_variables=optimizer_vars)
    unscaled_loss, y_pred, non_trainable, metrics_vars = aux
    _, metrics_vars = update_metrics(model, metrics_vars, unscaled_loss, x, y, y_pred,
                                     sample_weight)
    return grads, non_trainable, metrics_vars
