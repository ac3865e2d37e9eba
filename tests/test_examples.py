"""The ported TensorFlow guide programs in examples/ run to the end on 2 CPU replicas.

Each example runs in its own process (a fresh JAX with ``STRATAX_CPU_DEVICES=2``) with few
epochs or steps and ``--seed 0``, so its result is reproducible: each threshold sits just under
what the run reaches (measured with jax 0.10.2 and keras 3.15.1, identical run after run). The
module starts all of them at once and each test waits for its own: their imports and XLA
compilations are mostly single-threaded, so on 2 cores the whole module takes about as long as
the slowest example (ResNet50) instead of the sum.
``multi_worker_keras.py`` is not run here: it needs a multi-process launch.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
WAIT_S = 240  # per example, from the module's start; all run concurrently


class _ExampleRun:
    """One example started in its own process group, on 2 CPU replicas."""

    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        env = dict(os.environ, STRATAX_CPU_DEVICES="2")
        self.proc = subprocess.Popen([sys.executable, str(EXAMPLES / name), *args], cwd=REPO,
                                     env=env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)

    def output(self, timeout: float = WAIT_S) -> str:
        """Waits for the example and returns its stdout; fails on a timeout or non-zero exit."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"{self.name} ran past {timeout} s.\nstdout:\n{out[-4000:]}\n"
                        f"stderr:\n{err[-4000:]}")
        code = self.proc.returncode
        assert code == 0, f"{self.name} exited {code}:\n{err[-4000:]}"
        assert "Number of devices: 2" in out
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("mirrored_keras")
    loop_workdir = tmp_path_factory.mktemp("custom_training_loop")
    runs = {
        # The slowest first, so it starts compiling while the others import.
        "cifar_resnet": _ExampleRun("cifar_resnet.py", "--quick", "--seed", "0"),
        "mirrored_keras": _ExampleRun("mirrored_keras.py", "--epochs", "2", "--seed", "0",
                                      "--workdir", str(workdir)),
        "custom_training_loop": _ExampleRun("custom_training_loop.py", "--epochs", "2",
                                            "--seed", "0", "--workdir", str(loop_workdir)),
    }
    runs["mirrored_keras"].workdir = workdir
    try:
        yield runs
    finally:
        for run in runs.values():
            run.kill()


def _floats(pattern: str, text: str) -> list[float]:
    return [float(m) for m in re.findall(pattern, text)]


@pytest.mark.timeout(WAIT_S + 30)
def test_mirrored_keras_guide(examples):
    run = examples["mirrored_keras"]
    out = run.output()
    (eval_acc,) = _floats(r"Eval loss: [0-9.]+, Eval accuracy: ([0-9.]+)", out)
    # 10 classes; 2 epochs on 2 replicas reach 0.850 with seed 0 (seeds 0-3: 0.850-0.883; the
    # order of examples is stratax's (seed, epoch) shuffle, see docs/fit.md).
    assert eval_acc >= 0.84
    # The saved model gives the same result without a strategy and under it.
    assert _floats(r"Unreplicated model: .* Eval Accuracy: ([0-9.]+)", out) == [eval_acc]
    assert _floats(r"Replicated model: .* Eval Accuracy: ([0-9.]+)", out) == [eval_acc]
    assert (run.workdir / "training_checkpoints" / "ckpt_2.weights.h5").is_file()
    assert _floats(r"Learning rate for epoch 2 is ([0-9.e-]+)", out) == [pytest.approx(1e-2)]


@pytest.mark.timeout(WAIT_S + 30)
def test_custom_training_loop_tutorial(examples):
    out = examples["custom_training_loop"].output()
    epochs = re.findall(r"Epoch (\d+), Loss: ([0-9.]+), Accuracy: ([0-9.]+), Test Loss: "
                        r"([0-9.]+), Test Accuracy: ([0-9.]+)", out)
    assert [e[0] for e in epochs] == ["1", "2"]
    losses = [float(e[1]) for e in epochs]
    assert losses[1] < losses[0]
    loop_test_acc = float(epochs[-1][4])
    assert loop_test_acc >= 54.0  # percent; chance is 10; 2 epochs with seed 0 reach 55.43
    # The state written back into the Keras model evaluates like the loop's own test metric,
    # and a copy restored without a strategy gives the same accuracy.
    (keras_acc,) = _floats(r"Keras evaluate under the strategy: loss [0-9.]+, accuracy ([0-9.]+)",
                           out)
    (restored_acc,) = _floats(r"without strategy: ([0-9.]+)", out)
    assert keras_acc == pytest.approx(loop_test_acc, abs=0.01)
    assert restored_acc == keras_acc


@pytest.mark.timeout(WAIT_S + 30)
def test_cifar_resnet_quick(examples):
    """ResNet50 (23.6M parameters) builds, compiles and takes one step on 2 CPU replicas.

    Alone on 2 idle cores it takes about 40 s: ~10 s building, ~20 s compiling the step.
    """
    out = examples["cifar_resnet"].output()
    assert "Built ResNet50 (23,608,202 parameters)" in out
    (loss,) = _floats(r"Final loss: ([0-9.naif]+)", out)
    # The untrained network's loss on its 4 random images: 3.9040 with seed 0 on every run
    # (chance level would be ln 10 = 2.30); a NaN or another model would not land here.
    assert loss == pytest.approx(3.904, abs=0.05)
