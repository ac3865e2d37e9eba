"""Every input kind trains, evaluates and predicts the same under every strategy (issue 8 #1-3).

The reference is OneDeviceStrategy in this process. Each variant runs under MirroredStrategy with
1, 2 and 4 replicas, with and without ``sx.BackupAndRestore`` (adding a callback must not change
what is trained), and under MultiWorkerMirroredStrategy with 2 real worker processes.
"""

import os
import sys

import numpy as np
import pytest
from conftest import PROGRAMS, ROOT
from input_matrix import (
    GLOBAL_BATCH,
    OPTION_VARIANTS,
    USER_VARIANTS,
    VARIANTS,
    make_data,
    make_model,
    run_variant,
)

import stratax as sx
from stratax._src.launch import launch

pytestmark = pytest.mark.timeout(300)

# The workers import the stratax under test (this checkout), not whatever is installed.
_PATH = os.pathsep.join([str(PROGRAMS), str(ROOT)])
_references: dict[str, dict[str, np.ndarray]] = {}
_ARRAYS = ("class_weight", "shuffled_arrays")  # the VARIANTS that give fit arrays


def _reference(variant):
    """OneDeviceStrategy; for fit's options on arrays, Keras alone (no strategy): one device
    keeps arrays on the device too, and a row order wrong there would be wrong everywhere."""
    if variant not in _references:
        alone = variant in OPTION_VARIANTS
        _references[variant] = run_variant(
            sx.get_strategy() if alone else sx.OneDeviceStrategy("cpu:0"), variant)
        if alone:  # Keras' own batches, cut on the host; the tests count what stratax keeps
            assert int(_references[variant].pop("kept_on_devices")) == 0
    return _references[variant]


def _assert_equal(got, want, where):
    assert got["counts"].tolist() == want["counts"].tolist(), where  # no double counting
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=2e-5, rtol=2e-5,
                                   err_msg=f"{where}: {key}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("replicas,backup", [(2, False), (4, False), (2, True), (1, True)])
def test_input_kind_equals_one_device(variant, replicas, backup, tmp_path):
    strategy = sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    got = run_variant(strategy, variant, backup_dir=tmp_path / "backup" if backup else None)
    _assert_equal(got, _reference(variant), f"{variant}, {replicas} replicas, backup={backup}")


@pytest.mark.parametrize("variant", USER_VARIANTS)
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_user_pipeline_equals_one_device(variant, replicas):
    """tf.data, grain and re-iterables: every epoch read anew, equal to one device."""
    strategy = sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    got = run_variant(strategy, variant)
    want = _reference(variant)
    assert want["batches_per_epoch"].tolist() == [10, 10], variant  # every epoch trained
    _assert_equal(got, want, f"{variant}, {replicas} replicas")


@pytest.mark.parametrize("variant",
                         ["tf_data", "tf_data_dict", "tf_data_repeat", "tf_data_validation"])
def test_user_pipeline_equals_keras_alone(variant):
    """The reference itself: one device under stratax trains what Keras alone trains."""
    _assert_equal(run_variant(sx.get_strategy(), variant), _reference(variant),
                  f"{variant}, Keras alone")


@pytest.mark.parametrize("variant", OPTION_VARIANTS)
def test_fit_option_on_array_input_equals_keras_alone(variant):
    for devices in (["cpu:0"], ["cpu:0", "cpu:1"]):
        got = run_variant(sx.MirroredStrategy(devices), variant)
        _assert_equal(got, _reference(variant), f"{variant}, {len(devices)} replicas")
        assert int(got["kept_on_devices"]) == (2 if variant == "fit_twice" else 1)


def test_array_inputs_are_kept_on_the_devices():
    """What the matrix compares includes where the batches came from: every strategy must keep
    array input on its devices once per fit, as one device does, and gather the batches there."""
    for variant in VARIANTS:
        arrays = variant in _ARRAYS
        assert int(_reference(variant)["kept_on_devices"]) == int(arrays), variant


def test_class_weight_changes_the_loss():
    """The weighted loss differs from the unweighted one, so the comparison above has teeth."""
    weighted = _reference("class_weight")["loss"]
    unweighted = run_variant(sx.OneDeviceStrategy("cpu:0"), "shuffled_arrays")["loss"]
    assert not np.allclose(weighted, unweighted, rtol=1e-3)


def _on_two_workers(variants, tmp_path, monkeypatch):
    for name in ("STRATAX_CPU_DEVICES", "TF_CONFIG", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    result = launch([sys.executable, "mwms_inputs_program.py", str(tmp_path), *variants],
                    cwd=str(PROGRAMS), capture_output=True, stream_output=False,
                    env={"PYTHONPATH": _PATH}, nproc_per_node=2, timeout=240)
    assert result.ok, result.summary + "\n" + "\n".join(result.outputs[0][-30:])
    for variant in variants:
        for worker in (0, 1):
            with np.load(tmp_path / f"{variant}_{worker}.npz") as saved:
                got = {key: saved[key] for key in saved.files}
            _assert_equal(got, _reference(variant), f"{variant}, worker {worker} of 2")


def test_every_input_kind_and_user_pipeline_on_two_workers(tmp_path, monkeypatch):
    """Every input kind, and the user's pipelines (tf.data sharded by data and by the user
    with AutoShardPolicy.OFF, grain, re-iterables), on 2 real workers (one launch) train what
    one process trains."""
    assert not set(VARIANTS) & set(USER_VARIANTS)
    _on_two_workers([*VARIANTS, *USER_VARIANTS], tmp_path, monkeypatch)


@pytest.mark.slow
def test_fit_options_on_array_input_on_two_workers(tmp_path, monkeypatch):
    _on_two_workers(OPTION_VARIANTS, tmp_path, monkeypatch)


def test_pipelines_sharded_at_the_source_on_two_workers(tmp_path, monkeypatch):
    """Each worker reads only its shard: a tf.data pipeline over files under TensorFlow's AUTO
    policy (its files, half of them), a grain DataLoader with ShardByJaxProcess (its records).
    The workers' k-th parts together are the global batch k that one process trains on to the
    same weights."""
    x, y = make_data(n=96)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for part in range(4):  # 4 files of 24 rows: each worker's 2 files give 6 batches of 8
        rows = range(part * 24, (part + 1) * 24)
        (data_dir / f"part{part}.csv").write_text("".join(
            ",".join(map(str, [i, *x[i].tolist(), y[i]])) + "\n" for i in rows))
    for name in ("STRATAX_CPU_DEVICES", "TF_CONFIG", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    result = launch([sys.executable, "mwms_file_shard_program.py", str(data_dir), str(tmp_path)],
                    cwd=str(PROGRAMS), capture_output=True, stream_output=False,
                    env={"PYTHONPATH": _PATH}, nproc_per_node=2, timeout=240)
    assert result.ok, result.summary + "\n" + "\n".join(result.outputs[0][-30:])
    for name, shard_of in (("files", lambda ids: set((ids // 24).ravel().tolist())),
                           ("grain", lambda ids: set((ids // 48).ravel().tolist()))):
        saved = [dict(np.load(tmp_path / f"{name}_{w}.npz")) for w in (0, 1)]
        for worker, got in enumerate(saved):
            want = {worker, worker + 2} if name == "files" else {worker}
            assert shard_of(got["ids"]) == want, f"{name}: worker {worker} read the wrong shard"
            assert got["ids"].shape == (6, GLOBAL_BATCH // 2), name
        batches = [np.concatenate([saved[0]["ids"][k], saved[1]["ids"][k]]) for k in range(6)]
        model = make_model(sx.OneDeviceStrategy("cpu:0"))
        history = model.fit([(x[rows], y[rows]) for rows in batches], epochs=2, verbose=0)
        for got in saved:
            np.testing.assert_allclose(got["loss"], history.history["loss"], atol=2e-5,
                                       rtol=2e-5, err_msg=name)
            for i, want in enumerate(model.get_weights()):
                np.testing.assert_allclose(got[f"w{i}"], want, atol=2e-5, rtol=2e-5,
                                           err_msg=name)
