"""The environment contract every launched worker sees (real processes on 127.0.0.1)."""

from __future__ import annotations

import json
import sys

import pytest

from stratax._src.core import env as env_names
from stratax._src.launch import Address, LaunchConfig, build_worker_specs, launch

DUMP_ENV = '''
names = ["STRATAX_COORDINATOR_ADDRESS", "STRATAX_NUM_PROCESSES", "STRATAX_PROCESS_ID",
         "STRATAX_LOCAL_RANK", "STRATAX_RESTART_COUNT", "TF_CONFIG", "PYTHONUNBUFFERED"]
with open(os.path.join(OUT, "env_%d.json" % RANK), "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
'''


@pytest.mark.timeout(20)
def test_single_node_workers_get_stratax_vars_and_tf_config(scripts):
    script = scripts.write("dump.py", DUMP_ENV)
    result = launch([sys.executable, script], nproc_per_node=3, stream_output=False)
    assert result.ok, result.summary
    seen = [json.loads((scripts.out / f"env_{rank}.json").read_text()) for rank in range(3)]

    coordinator = seen[0]["STRATAX_COORDINATOR_ADDRESS"]
    host, port = coordinator.rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    workers = json.loads(seen[0]["TF_CONFIG"])["cluster"]["worker"]
    assert workers[0] == coordinator  # worker 0 hosts the coordinator
    assert all(w.startswith("127.0.0.1:") for w in workers)
    assert len({w.rsplit(":", 1)[1] for w in workers}) == 3  # distinct ports
    for rank, env in enumerate(seen):
        assert env["STRATAX_COORDINATOR_ADDRESS"] == coordinator
        assert env["STRATAX_NUM_PROCESSES"] == "3"
        assert env["STRATAX_PROCESS_ID"] == str(rank)
        assert env["STRATAX_LOCAL_RANK"] == str(rank)
        assert env["STRATAX_RESTART_COUNT"] == "0"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert json.loads(env["TF_CONFIG"]) == {
            "cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}


@pytest.mark.timeout(20)
def test_second_node_gets_global_ranks_and_no_tf_config(scripts, listening_socket):
    script = scripts.write("dump.py", DUMP_ENV)
    coordinator = f"127.0.0.1:{listening_socket.getsockname()[1]}"  # "node 0" is listening
    result = launch(
        [sys.executable, script], nproc_per_node=2, nnodes=2, node_rank=1,
        coordinator=coordinator, coordinator_wait=5.0, stream_output=False,
        env={"TF_CONFIG": '{"stale": true}'},  # inherited TF_CONFIG must not leak through
    )
    assert result.ok, result.summary
    for local_rank, rank in enumerate((2, 3)):
        env = json.loads((scripts.out / f"env_{rank}.json").read_text())
        assert env["STRATAX_COORDINATOR_ADDRESS"] == coordinator
        assert env["STRATAX_NUM_PROCESSES"] == "4"
        assert env["STRATAX_PROCESS_ID"] == str(rank)
        assert env["STRATAX_LOCAL_RANK"] == str(local_rank)
        assert env["TF_CONFIG"] is None


def test_worker_specs_with_fixed_coordinator_use_its_host_and_port():
    config = LaunchConfig(nproc_per_node=2, coordinator="localhost:29500")
    specs = build_worker_specs(config, Address("localhost", 29500), restart_count=2,
                               base_env={"KEEP": "1"}, worker_ports=[29500, 41000])
    assert [s.name for s in specs] == ["worker 0", "worker 1"]
    tf_config = json.loads(specs[1].env[env_names.TF_CONFIG])
    assert tf_config["cluster"]["worker"] == ["localhost:29500", "127.0.0.1:41000"]
    assert tf_config["task"] == {"type": "worker", "index": 1}
    assert specs[1].env[env_names.STRATAX_RESTART_COUNT] == "2"
    assert specs[1].env["KEEP"] == "1"


def test_worker_specs_reject_ports_not_starting_with_coordinator():
    config = LaunchConfig(nproc_per_node=2)
    with pytest.raises(ValueError, match="starting with the coordinator port 1234"):
        build_worker_specs(config, Address("127.0.0.1", 1234), 0, {}, worker_ports=[1, 2])
