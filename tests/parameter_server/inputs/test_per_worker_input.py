"""Per-worker datasets without a cluster: what create_per_worker_dataset accepts, how a worker
builds it, and the release of garbage-collected iterators."""

import collections
import gc
import threading
import time
import types

import numpy as np
import pytest

from stratax._src.distributed_input.input_context import InputContext
from stratax._src.parameter_server.inputs import dataset_source, worker_input
from stratax._src.parameter_server.inputs.iterator_registry import IteratorRegistry
from stratax._src.parameter_server.inputs.per_worker_dataset import PerWorkerIterator

strategy = object()  # stands for the chief's strategy, read by per_worker_fn by name


def tagged(context):
    return [np.array([context.input_pipeline_id, context.num_input_pipelines])]


def per_worker_fn():
    return strategy.distribute_datasets_from_function(tagged)


def test_the_guides_per_worker_function_gets_the_workers_dataset():
    global strategy
    chief_strategy = strategy
    source = dataset_source.describe(per_worker_fn, chief_strategy)
    assert source.meta["fn"]["strategies"] == ["strategy"]
    try:
        dataset = worker_input.build_dataset(source.meta, source.tensors,
                                             InputContext(3, 1, 1))
        assert [b.tolist() for b in dataset] == [[1, 3]]    # worker 1 of 3
        assert isinstance(strategy, worker_input.WorkerStrategy)
        with pytest.raises(AttributeError, match="does not exist on a worker"):
            strategy.run  # noqa: B018 - the attribute access is the test
    finally:
        strategy = chief_strategy
    with pytest.raises(RuntimeError, match="inside the function given to"):
        worker_input.WorkerStrategy().distribute_datasets_from_function(tagged)


def test_distribute_datasets_from_function_on_the_chief_is_built_on_the_workers():
    on_chief = dataset_source.DistributedDatasetsFromFunction(tagged)
    with pytest.raises(ValueError, match=r"coordinator\.create_per_worker_dataset"):
        iter(on_chief)
    source = dataset_source.describe(on_chief, strategy)
    assert source.meta["input_context"] and source.meta["fn"]["strategies"] == []
    dataset = worker_input.build_dataset(source.meta, source.tensors, InputContext(2, 0, 1))
    assert [b.tolist() for b in dataset] == [[0, 2]]


def test_refused_sources_name_what_is_accepted():
    with pytest.raises(TypeError, match="create_per_worker_dataset takes a dataset function"):
        dataset_source.describe(42, strategy)
    with pytest.raises(TypeError, match=r"takes a tf\.data\.Dataset"):
        dataset_source.DistributedDataset([np.zeros(2)])
    with pytest.raises(ValueError, match="cannot be sent to workers"):
        dataset_source.describe(lambda: [], strategy)


def test_a_tf_dataset_travels_as_its_graph():
    tf = pytest.importorskip("tensorflow")
    dataset = tf.data.Dataset.range(1, 11).batch(4).map(lambda x: {"x": x, "twice": 2 * x})
    source = dataset_source.describe(dataset_source.DistributedDataset(dataset), strategy)
    assert set(source.meta) == {"graph"} and source.tensors[0].dtype == np.uint8
    rebuilt = worker_input.build_dataset(source.meta, source.tensors, InputContext())
    first = next(iter(rebuilt))
    assert first["x"].numpy().tolist() == [1, 2, 3, 4]             # TF's first batch
    assert first["twice"].numpy().tolist() == [2, 4, 6, 8]
    python = tf.data.Dataset.from_generator(lambda: iter([1]),
                                            output_signature=tf.TensorSpec((), tf.int32))
    with pytest.raises(ValueError, match="runs Python"):
        dataset_source.describe(python, strategy)
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]]))
    with pytest.raises(TypeError, match="dense tensors"):
        dataset_source.describe(ragged, strategy)


class _Client:
    def __init__(self, calls):
        self.calls = calls

    def call(self, method, meta):
        self.calls.append((method, meta["iterator"]))


def _worker(index, alive, calls):
    return types.SimpleNamespace(index=index, alive=alive, iterators={"a", "b"},
                                 consumed=collections.Counter(a=3, b=1), client=_Client(calls))


def test_a_collected_iterator_is_released_on_the_live_workers_that_hold_it():
    calls = []
    workers = [_worker(0, True, calls), _worker(1, False, calls)]
    registry = IteratorRegistry(workers)
    try:
        registry.add("a", "source a")
        registry.add("b", "source b")
        iterator = PerWorkerIterator("a", "leaf", [], registry.released)
        del iterator
        gc.collect()
        deadline = time.monotonic() + 10
        while "a" in registry.live() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert registry.live() == {"b": "source b"}
        assert calls == [("drop_iterator", "a")]                      # the dead worker: none
        assert [w.iterators for w in workers] == [{"b"}, {"b"}]
        assert all("a" not in w.consumed for w in workers)
    finally:
        registry.stop()
    assert "stratax-iterator-release" not in {t.name for t in threading.enumerate()}


def test_a_closure_records_the_iterator_of_each_batch_and_refuses_mixed_sources():
    import jax

    from stratax._src.parameter_server.closures import Closure, recording_into
    from stratax._src.parameter_server.inputs.worker_data import ArrayData

    spec = [jax.ShapeDtypeStruct((2,), np.float32)]
    first, second = PerWorkerIterator("it0", "leaf", spec), PerWorkerIterator("it1", "leaf", spec)
    with recording_into(Closure(0)) as closure:
        refs = [next(first), next(second), next(first)]
        assert [r.batch for r in refs] == [0, 1, 2]
        assert [it.name for it in closure.iterators] == ["it0", "it1", "it0"]
        with pytest.raises(ValueError, match="per-worker iterators or one ArrayData, not both"):
            ArrayData((np.zeros((4, 2)),)).batch(np.arange(2))
    with recording_into(Closure(1)):
        ArrayData((np.zeros((4, 2)),)).batch(np.arange(2))
        with pytest.raises(ValueError, match="per-worker iterators or one ArrayData, not both"):
            next(first)
