"""Worker program for tests/multiprocess/test_sharded_state.py: checkpoints of arrays
sharded over processes, written by each process, read into other layouts.

Usage: python sharded_state_program.py DIR MODE
MODE "save" (2 processes x 2 devices, TF_CONFIG names the cluster): writes two versions of
the state below, each process its own shards, checks that a version is not visible before
every process wrote, then reads the second version back into another layout.
Then, under ``MultiWorkerMirroredStrategy(cores_per_replica=4, layout_map=...)`` (which
starts the job), ``sx.checkpoint.save_variables`` of a kernel split over both processes
(gathered into a whole file), ``load_variables`` back into a model's parts, and the refusal
when one process is short of memory.
MODE "restore" (1 process, 2 devices): reads it whole and onto this process's devices.
Prints "OK <checks>" when every check passed.
"""

import os
import sys
import threading
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

directory, mode = sys.argv[1], sys.argv[2]
if mode == "save":  # the strategy starts jax.distributed from TF_CONFIG
    import keras

    import stratax as sx
    from stratax._src.checkpoint import variables_file
    from stratax._src.keras import model_parallel

    layout = keras.distribution.LayoutMap(None)
    layout[".*wide.*kernel"] = (None, "core")  # 8 columns over 4 cores of 2 processes
    strategy = sx.MultiWorkerMirroredStrategy(
        cores_per_replica=4, layout_map=layout,
        communication_options=sx.CommunicationOptions(timeout_seconds=60))

from stratax._src.checkpoint import sharded_state, versions  # noqa: E402


def expected(version):
    """The state of ``version``: names and their whole values."""
    return {
        "model/dense/kernel": np.arange(96, dtype=np.float32).reshape(8, 12) + version,
        "model/dense/bias": np.arange(12, dtype=np.float32) * 2 + version,
        "optimizer/adam/m": (np.arange(40, dtype=np.float32).reshape(8, 5) / 3 + version
                             ).astype(jax.numpy.bfloat16),
        "optimizer/iterations": np.array(7 + version, np.int32),
    }


def check_placed(entry, sharding, whole, name):
    """``entry`` restored into a variable held on ``sharding`` has ``whole``'s values: on that
    sharding, every local shard, when it splits over processes, else as one NumPy array."""
    placed = sharded_state.value_for(_Held(sharding, whole), entry)
    if isinstance(placed, np.ndarray):
        assert not sharded_state.is_sharded(_Held(sharding, whole)._value), name
        np.testing.assert_array_equal(placed, whole, err_msg=name)
        return
    assert placed.sharding == sharding, (name, placed.sharding)
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), whole[shard.index], err_msg=name)


class _Held:
    """A stand-in variable whose held value lies on ``sharding`` (what ``value_for`` reads)."""

    def __init__(self, sharding, whole):
        self._value = jax.make_array_from_callback(whole.shape, sharding, lambda i: whole[i])


def variables_in_parts():
    """``sx.checkpoint.save_variables`` of a kernel (and its Adam slots) split over both
    processes writes it whole; ``load_variables`` puts it back into another model's parts; a
    process short of memory makes both refuse. Returns the number of checks."""
    def build():
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="wide")])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        return model

    def holds(variable, whole):
        """``variable`` holds ``whole``'s values in each of its parts here (no gather)."""
        for shard in variable.value.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), whole[shard.index],
                                          err_msg=variable.path)

    # Known state (not trained: no step to compile), placed into the parts: the weights by
    # set_weights, Adam's slots as load_variables places them.
    known = [np.arange(48, dtype=np.float32).reshape(6, 8) / 7, np.arange(8, dtype=np.float32)]
    model = build()
    model.set_weights(known)
    model.optimizer.build(model.trainable_variables)
    slots = {v.path: np.full(v.shape, 0.5 + n, np.float32)
             for n, v in enumerate(model.optimizer.variables) if v.shape}
    for v in model.optimizer.variables:
        if v.path in slots:
            v.assign(sharded_state.value_for(v, slots[v.path]))
    model.optimizer.iterations.assign(3)
    kernel = model.layers[0].kernel
    assert sharded_state.is_sharded(kernel.value), kernel.value.sharding

    path = os.path.join(directory, "variables", f"variables{jax.process_index()}.npz")
    sx.checkpoint.save_variables(path, model.trainable_variables, model.optimizer)
    entries, data = variables_file.read(path)
    assert [e["name"] for e in entries] == ["wide/kernel", "wide/bias"], entries
    assert entries[0]["iterations"][0][2] == 3, entries
    for i, (variable, whole) in enumerate(zip(model.trainable_variables, known, strict=True)):
        np.testing.assert_array_equal(data[f"value/{i}"], whole)
        for slot, keras_name in (("m", "momentum"), ("v", "velocity")):
            name = f"adam/{variable.path.replace('/', '_')}_{keras_name}"
            np.testing.assert_array_equal(data[f"slot/{i}/{slot}"], slots[name])

    other = build()  # new initial values, same layout; its optimizer is built by the load
    sx.checkpoint.load_variables(path, other.trainable_variables, other.optimizer)
    assert other.layers[0].kernel.value.sharding == kernel.value.sharding
    for variable, whole in zip(other.trainable_variables, known, strict=True):
        holds(variable, whole)
    for variable in other.optimizer.variables:
        if variable.path in slots:
            holds(variable, slots[variable.path])
    assert int(other.optimizer.iterations.numpy()) == 3

    if jax.process_index() == 1:  # short of memory: both refuse, neither waits for the other
        model_parallel._memory_left = lambda: 0
    refused = os.path.join(directory, "variables", f"refused{jax.process_index()}.npz")
    try:
        sx.checkpoint.save_variables(refused, model.trainable_variables, model.optimizer)
        raise AssertionError("save_variables gathered state that does not fit")
    except MemoryError as err:
        assert "sx.checkpoint.save_variables" in str(err) and "wide/kernel" in str(err), err
        assert "BackupAndRestore" in str(err), err
    assert not os.path.exists(refused)
    return 3


checks = 0
if mode == "save":
    devices = np.array(jax.devices()).reshape(2, 2)  # row = process
    grid = Mesh(devices, ("a", "b"))
    layouts = {"model/dense/kernel": P("a", "b"), "model/dense/bias": P("b"),
               "optimizer/adam/m": P("a"), "optimizer/iterations": P()}
    process = jax.process_index()

    def save(version, delay=0.0):
        values = {name: jax.make_array_from_callback(
            whole.shape, NamedSharding(grid, layouts[name]), lambda i, w=whole: w[i])
            for name, whole in expected(version).items()}
        sharded = [n for n, v in values.items() if sharded_state.is_sharded(v)]
        # the bias is split inside each process and repeated across them: still no process's
        # np.asarray reads it, so it goes by shards (process 0 writes both, 1 none)
        assert sharded == ["model/dense/kernel", "model/dense/bias", "optimizer/adam/m"]
        parts = {n: sharded_state.local_parts(values[n]) for n in sharded}
        pieces = {n: len(p.pieces) for n, p in parts.items()}
        assert pieces == ({"model/dense/kernel": 2, "model/dense/bias": 2, "optimizer/adam/m": 1}
                          if process == 0 else
                          {"model/dense/kernel": 2, "model/dense/bias": 0,
                           "optimizer/adam/m": 1}), pieces
        whole = {"optimizer/iterations": np.asarray(values["optimizer/iterations"])}
        time.sleep(delay)
        return versions.save_sharded(directory, whole if process == 0 else {}, parts,
                                          {"format": 2, "version": version}, list(values))

    first = save(0)
    assert (first is not None) == (process == 0)
    checks += 1
    if process == 0:
        # A dead job's staging directory (no writer holds it) is removed by the next commit.
        os.makedirs(os.path.join(directory, ".staging-sharded-deadjob-0"))
        # Process 1 writes 2 s late: until then the new version must not be visible.
        done = threading.Thread(target=save, args=(1,))
        done.start()
        time.sleep(1.0)
        assert versions.latest_version(directory).name == "ckpt-0"
        assert done.is_alive()
        done.join()
        checks += 1
    else:
        save(1, delay=2.0)
    assert versions.latest_version(directory).name == "ckpt-1"
    assert sorted(os.listdir(directory)) == ["ckpt-1", "latest"], os.listdir(directory)
    checks += 1
    # Restore on 2 processes into another layout: 4 devices on one axis, split by columns.
    line = Mesh(np.array(jax.devices()), ("x",))
    other = {"model/dense/kernel": P(None, "x"), "model/dense/bias": P("x"),
             "optimizer/adam/m": P(None, None), "optimizer/iterations": P()}
    arrays, meta = versions.load(directory)
    assert list(arrays) == list(expected(1)) and meta["version"] == 1
    for name, whole in expected(1).items():
        check_placed(arrays[name], NamedSharding(line, other[name]), whole, name)
        checks += 1
    checks += variables_in_parts()
else:
    arrays, meta = versions.load(directory)
    assert meta["processes"] == 2
    mesh = Mesh(np.array(jax.devices()), ("x",))
    for name, whole in expected(1).items():
        value = np.asarray(arrays[name])
        assert value.dtype == whole.dtype, (name, value.dtype)
        np.testing.assert_array_equal(value, whole, err_msg=name)
        check_placed(arrays[name], NamedSharding(mesh, P("x") if whole.ndim else P()), whole,
                     name)
        checks += 1
    # One region, read from the pieces it overlaps (two processes' rows).
    region = arrays["model/dense/kernel"].read((slice(2, 6), slice(5, 7)))
    np.testing.assert_array_equal(region, expected(1)["model/dense/kernel"][2:6, 5:7])
    checks += 1
print("OK", checks, flush=True)
