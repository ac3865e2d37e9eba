"""``sx.experimental.PreemptionCheckpointHandler`` on 2 real workers (issue 49 #10).

Worker 1 gets a SIGTERM mid-loop: every worker stops at the step JAX's preemption service
agrees on, the chief saves, all exit with ``PREEMPTION_EXIT_CODE``; ``launch(max_restarts=1)``
starts the group again, the handler restores, and the loop ends at the weights of an
uninterrupted loop in one process. Under ``--nproc-per-node 1:2`` (elastic) the preempted
group goes on with one worker, to the same weights.
"""

import sys

import numpy as np
import pytest
from conftest import PROGRAMS, worker_env
from preemption_program import batch, make_model

import stratax as sx
from stratax._src.checkpoint import versions
from stratax._src.launch import launch

pytestmark = pytest.mark.timeout(240)
STEPS, PREEMPT_AT = 40, 5


def test_sigterm_saves_and_the_restarted_loop_resumes(tmp_path, monkeypatch):
    out = _preempted_run(tmp_path, monkeypatch, 2, nproc_per_node=2, max_restarts=1)
    _assert_uninterrupted(tmp_path / "ckpt", out, workers=(0, 1))


def test_a_preempted_elastic_loop_goes_on_with_one_worker_to_the_same_weights(
        tmp_path, monkeypatch):
    """``--nproc-per-node 1:2 --max-restarts 0``: the preemption is a failure past the slot's
    restarts, so the slot the launcher blames is dropped for good; the one worker left restores
    the checkpoint two wrote, feeds the whole global batch, and ends at the same weights."""
    out = _preempted_run(tmp_path, monkeypatch, 1, nproc_per_node=2, min_nproc_per_node=1,
                         max_restarts=0)
    _assert_uninterrupted(tmp_path / "ckpt", out, workers=(0,))


def _preempted_run(tmp_path, monkeypatch, workers_at_the_end, **shape):
    for name in ("STRATAX_CPU_DEVICES", "TF_CONFIG", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    result = launch([sys.executable, "preemption_program.py", str(ckpt), str(out), str(STEPS),
                     str(PREEMPT_AT)], cwd=str(PROGRAMS), capture_output=True,
                    stream_output=False, env=worker_env(), timeout=200, **shape)
    assert result.ok, result.summary + "\n" + "\n".join(result.outputs[0][-30:])
    assert result.restarts == 1 and result.failures[0].exit_code == sx.PREEMPTION_EXIT_CODE
    assert result.workers == workers_at_the_end, result.summary
    return out


def _assert_uninterrupted(ckpt, out, workers):
    _, meta = versions.load(ckpt)
    saved_at = meta["total_run_calls"]
    assert PREEMPT_AT <= saved_at < STEPS, meta  # saved at the agreed step, past the notice
    model = make_model(sx.OneDeviceStrategy("cpu:0"))
    for step in range(STEPS):
        model.train_on_batch(*batch(step))
    for worker in workers:
        with np.load(out / f"weights_{worker}.npz") as saved:
            assert int(saved["resumed_at"]) == saved_at, worker
            for i, want in enumerate(model.get_weights()):
                np.testing.assert_allclose(saved[f"arr_{i}"], want, rtol=2e-5, atol=2e-5,
                                           err_msg=f"worker {worker}, weight {i}")
