"""TPUClusterResolver from a faked TPU-VM environment: single host, a 2-host pod, errors."""

from __future__ import annotations

import re

import pytest

from stratax._src.cluster.process_layout import process_layout
from stratax._src.cluster.tpu import TPUClusterResolver, parse_accelerator_type
from stratax._src.core import env

TPU_VARS = (env.TPU_NAME, env.TPU_WORKER_ID, env.TPU_WORKER_HOSTNAMES, env.TPU_PROCESS_ADDRESSES,
            env.TPU_ACCELERATOR_TYPE, env.TPU_PROCESS_BOUNDS, env.TPU_CHIPS_PER_PROCESS_BOUNDS,
            env.MEGASCALE_COORDINATOR_ADDRESS, env.MEGASCALE_NUM_SLICES, env.MEGASCALE_SLICE_ID,
            env.COLAB_TPU_ADDR, env.STRATAX_TPU_EMULATION)


@pytest.fixture
def tpu_env(cluster_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in TPU_VARS:
        cluster_env.delenv(name, raising=False)
    return cluster_env


@pytest.mark.parametrize("tpu", [None, "", "local"])
def test_single_host_tpu_vm(tpu_env: pytest.MonkeyPatch, tpu: str | None) -> None:
    tpu_env.setenv(env.TPU_ACCELERATOR_TYPE, "v3-8")
    tpu_env.setenv(env.TPU_WORKER_ID, "0")
    tpu_env.setenv(env.TPU_WORKER_HOSTNAMES, "t1v-n-abc-w-0")
    resolver = TPUClusterResolver(tpu=tpu)
    assert resolver.tpu == "local"
    assert resolver.accelerator_type == "v3-8"
    assert not resolver.is_multi_host()
    assert resolver.distributed_init_args() is None
    assert resolver.master() == ""
    assert not resolver.cluster_spec()
    assert resolver.num_accelerators() == {"TPU": 8}
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert process_layout(resolver).num_processes == 1
    assert resolver.emulation_cores is None and resolver.environment == ""


def test_two_host_pod(tpu_env: pytest.MonkeyPatch) -> None:
    tpu_env.setenv(env.TPU_ACCELERATOR_TYPE, "v4-16")
    tpu_env.setenv(env.TPU_WORKER_ID, "1")
    tpu_env.setenv(env.TPU_WORKER_HOSTNAMES, "10.0.0.2,10.0.0.3")
    tpu_env.setenv(env.TPU_CHIPS_PER_PROCESS_BOUNDS, "2,2,1")
    resolver = TPUClusterResolver(tpu="")
    assert resolver.is_multi_host()
    assert resolver.hosts == ("10.0.0.2", "10.0.0.3")
    assert resolver.distributed_init_args() == {
        "coordinator_address": "10.0.0.2:8482", "num_processes": 2, "process_id": 1}
    layout = process_layout(resolver)
    assert (layout.coordinator_address, layout.num_processes, layout.process_id) == (
        "10.0.0.2:8482", 2, 1)
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.2:8482", "10.0.0.3:8482"]}
    assert resolver.master() == "10.0.0.3:8482"
    assert resolver.master("worker", 0, rpc_layer="grpc") == "grpc://10.0.0.2:8482"
    assert resolver.num_accelerators() == {"TPU": 4}   # 4 megacore chips per host


def test_gke_addresses_and_multislice(tpu_env: pytest.MonkeyPatch) -> None:
    tpu_env.setenv(env.TPU_PROCESS_ADDRESSES, "h0:8471,h1:8471")
    tpu_env.setenv(env.TPU_WORKER_ID, "0")
    tpu_env.setenv(env.MEGASCALE_NUM_SLICES, "2")
    tpu_env.setenv(env.MEGASCALE_SLICE_ID, "1")
    tpu_env.setenv(env.MEGASCALE_COORDINATOR_ADDRESS, "s0h0:1234")
    args = TPUClusterResolver().distributed_init_args()
    assert args == {"coordinator_address": "s0h0:8482", "num_processes": 4, "process_id": 2}


def test_pod_without_hosts_lets_jax_read_the_metadata(tpu_env: pytest.MonkeyPatch) -> None:
    tpu_env.setenv(env.TPU_ACCELERATOR_TYPE, "v5litepod-32")
    resolver = TPUClusterResolver("local")
    assert resolver.is_multi_host() and resolver.distributed_init_args() == {}


def test_named_remote_tpu_is_a_clear_error(tpu_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"tpu='my-tpu'.*Cloud TPU API.*tpu-vm ssh my-tpu"):
        TPUClusterResolver(tpu="my-tpu")
    with pytest.raises(ValueError, match=re.escape("grpc://10.1.2.3:8470")):
        TPUClusterResolver(tpu="grpc://10.1.2.3:8470")
    tpu_env.setenv(env.TPU_NAME, "remote-one")
    with pytest.raises(ValueError, match="remote-one"):
        TPUClusterResolver()


def test_own_tpu_name_on_a_tpu_vm_is_local(tpu_env: pytest.MonkeyPatch) -> None:
    tpu_env.setenv(env.TPU_NAME, "my-vm")
    tpu_env.setenv(env.TPU_ACCELERATOR_TYPE, "v2-8")
    assert TPUClusterResolver("my-vm").tpu == "local"


def test_emulation_with_several_hosts_listed_is_an_emulated_pod(
        tpu_env: pytest.MonkeyPatch) -> None:
    """One emulated host joins nobody, even on a large accelerator type; hosts listed in the
    environment make an emulated pod slice whose processes join as a pod's hosts do."""
    tpu_env.setenv(env.TPU_ACCELERATOR_TYPE, "v4-32")
    one_host = TPUClusterResolver(tpu="", emulation_cores=2)
    assert not one_host.is_multi_host() and one_host.distributed_init_args() is None
    tpu_env.setenv(env.TPU_WORKER_HOSTNAMES, "127.0.0.1,127.0.0.1")
    tpu_env.setenv(env.TPU_WORKER_ID, "1")
    pod = TPUClusterResolver(tpu="", coordinator_address="127.0.0.1:5000", emulation_cores=2)
    assert pod.is_multi_host()
    assert pod.distributed_init_args() == {
        "coordinator_address": "127.0.0.1:5000", "num_processes": 2, "process_id": 1}
    assert pod.num_accelerators() == {"TPU": 2}   # per host


def test_an_emulated_pod_under_stratax_launch_is_the_launchers_processes(
        tpu_env: pytest.MonkeyPatch) -> None:
    """Under ``stratax launch``, emulation makes each launched process a host of a pod,
    numbered, counted and joined by the launcher's variables; without emulation, or with one
    process, nothing is a pod."""
    tpu_env.setenv(env.STRATAX_NUM_PROCESSES, "2")
    tpu_env.setenv(env.STRATAX_PROCESS_ID, "1")
    tpu_env.setenv(env.STRATAX_COORDINATOR_ADDRESS, "127.0.0.1:6000")
    assert TPUClusterResolver(tpu="").distributed_init_args() is None
    pod = TPUClusterResolver(tpu="", emulation_cores=4)
    assert pod.is_multi_host() and pod.num_accelerators() == {"TPU": 4}
    assert pod.distributed_init_args() == {
        "coordinator_address": "127.0.0.1:6000", "num_processes": 2, "process_id": 1}
    tpu_env.setenv(env.STRATAX_NUM_PROCESSES, "1")
    tpu_env.setenv(env.STRATAX_PROCESS_ID, "0")
    assert TPUClusterResolver(tpu="", emulation_cores=4).distributed_init_args() is None


def test_legacy_colab_tpu_is_a_clear_error(tpu_env: pytest.MonkeyPatch) -> None:
    tpu_env.setenv(env.COLAB_TPU_ADDR, "10.0.0.9:8470")
    with pytest.raises(ValueError, match=r"legacy Colab TPU.*TPU VM runtime"):
        TPUClusterResolver(tpu="")


def test_emulation_argument_and_variable(tpu_env: pytest.MonkeyPatch) -> None:
    assert TPUClusterResolver().emulation_cores is None
    resolver = TPUClusterResolver(emulation_cores=8)
    assert resolver.emulation_cores == 8 and resolver.environment == "emulated"
    assert resolver.num_accelerators() == {"TPU": 8}
    assert "emulated" in repr(resolver)
    tpu_env.setenv(env.STRATAX_TPU_EMULATION, "4")
    assert TPUClusterResolver().emulation_cores == 4
    tpu_env.setenv(env.STRATAX_TPU_EMULATION, "four")
    with pytest.raises(ValueError, match="STRATAX_TPU_EMULATION='four'"):
        TPUClusterResolver()
    with pytest.raises(ValueError, match=r"emulation_cores must be a positive integer.*-1"):
        TPUClusterResolver(emulation_cores=-1)


def test_malformed_environment(tpu_env: pytest.MonkeyPatch) -> None:
    tpu_env.setenv(env.TPU_WORKER_HOSTNAMES, "h0,h1")
    with pytest.raises(ValueError, match="TPU_WORKER_ID is not set"):
        TPUClusterResolver()
    tpu_env.setenv(env.TPU_WORKER_ID, "2")
    with pytest.raises(ValueError, match="TPU_WORKER_ID=2 is not below the 2 hosts"):
        TPUClusterResolver()
    tpu_env.setenv(env.TPU_WORKER_HOSTNAMES, "h0,,h1")
    with pytest.raises(ValueError, match="empty entry"):
        TPUClusterResolver()
    tpu_env.delenv(env.TPU_WORKER_HOSTNAMES)
    tpu_env.setenv(env.TPU_ACCELERATOR_TYPE, "tpu-eight")
    with pytest.raises(ValueError, match="Cannot parse the TPU accelerator type 'tpu-eight'"):
        TPUClusterResolver()


@pytest.mark.parametrize("name, parsed", [
    ("v2-8", ("v2", 8)), ("v4-16", ("v4", 16)), ("v5litepod-8", ("v5", 8)),
    ("v5p-8", ("v5p", 8)), ("v6e-256", ("v6e", 256)),
])
def test_accelerator_types(name: str, parsed: tuple[str, int]) -> None:
    assert parse_accelerator_type(name) == parsed
