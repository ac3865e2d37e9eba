"""``TPUClusterResolver``: the Cloud TPU this program runs on, read from the TPU VM's environment.

On a TPU VM (and in a Colab TPU runtime, which is one) the TPU is attached to the host: JAX
talks to it through libtpu, no network address is needed. A TPU *pod slice* has several hosts;
the same program runs on every host, and the hosts join through ``jax.distributed``. What this
resolver reads (the names JAX's own ``cloud_tpu_cluster`` reads):

- ``TPU_WORKER_ID``: this host's index in the slice (0 hosts the coordinator);
- ``TPU_WORKER_HOSTNAMES`` (or GKE's ``TPU_PROCESS_ADDRESSES``): every host, comma-separated;
- ``TPU_ACCELERATOR_TYPE``: e.g. ``"v4-16"``, ``"v5litepod-8"``;
- ``MEGASCALE_NUM_SLICES`` / ``MEGASCALE_SLICE_ID`` / ``MEGASCALE_COORDINATOR_ADDRESS``
  (multislice).

When a pod slice does not state its hosts in the environment (a GCE TPU VM keeps them in its
metadata server), ``jax.distributed.initialize()`` finds them itself; ``distributed_init_args()``
says which case applies. A TPU *named* in ``tpu=`` (a TPU Node reached over the network, or
Colab's legacy ``COLAB_TPU_ADDR``) needs a Cloud API call that stratax does not make: that is an
error telling what to run instead.

Emulation (``emulation_cores=N`` or ``STRATAX_TPU_EMULATION=N``) lets N CPU devices play the TPU
cores, so a TPU program can be tested on a laptop; it is never switched on implicitly. With
``TPU_WORKER_HOSTNAMES`` / ``TPU_WORKER_ID`` listing several hosts it emulates a pod slice: one
process per listed host (all on this machine, e.g. ``localhost,localhost``), N cores each. Under
``stratax launch`` the launcher's processes are those hosts, numbered and joined by it.

This module is pure configuration: no JAX import, no network.
"""

from __future__ import annotations

import os
import re
from typing import Any

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.process_layout import ProcessLayout
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.core import env

# Port of the jax.distributed coordinator on host 0 of a pod slice (JAX's own TPU default).
TPU_COORDINATOR_PORT = 8482
_LOCAL_NAMES = ("", "local")
_ACCELERATOR_RE = re.compile(r"^(?P<generation>v\d+[a-z]*?)(?:litepod|pod)?-(?P<count>\d+)$")
# Largest `-N` suffix of a single-host slice (v2-8, v3-8, v4-8, v5litepod-8, v5p-8, v6e-8).
_SINGLE_HOST_MAX = 8
# JAX devices per chip: v2/v3 show each of a chip's 2 TensorCores; v4/v5p fuse them (megacore).
_DEVICES_PER_CHIP = {"v2": 2, "v3": 2}
_MEGACORE = ("v4", "v5p")
_TPU_VM_VARS = (env.TPU_WORKER_ID, env.TPU_WORKER_HOSTNAMES, env.TPU_PROCESS_ADDRESSES,
                env.TPU_ACCELERATOR_TYPE)


def emulation_cores_from_env() -> int | None:
    """``STRATAX_TPU_EMULATION`` as a core count, ``None`` when unset or ``0``.

    Raises:
      ValueError: the value is not an integer >= 0.
    """
    cores = env.get_optional_int(env.STRATAX_TPU_EMULATION, minimum=0)
    return cores or None


def parse_accelerator_type(accelerator_type: str) -> tuple[str, int]:
    """``"v4-16"`` -> ``("v4", 16)``; ``"v5litepod-8"`` -> ``("v5", 8)``.

    Raises:
      ValueError: the string is not of the form ``v<generation>[suffix]-<count>``.
    """
    match = _ACCELERATOR_RE.match(accelerator_type.strip().lower())
    if match is None:
        raise ValueError(
            f"Cannot parse the TPU accelerator type {accelerator_type!r}; expected the form "
            f"that {env.TPU_ACCELERATOR_TYPE} has on a TPU VM, e.g. 'v4-16' or 'v5litepod-8'."
        )
    return match.group("generation"), int(match.group("count"))


class TPUClusterResolver(ClusterResolver):
    """The Cloud TPU attached to this VM (and, on a pod slice, its other hosts).

    Accepts TensorFlow's arguments; ``tpu`` may be ``None``, ``""`` or ``"local"``: all mean the
    TPU of this VM (TensorFlow's ``tpu=""`` on Colab and ``tpu="local"`` on a TPU VM). ``zone``,
    ``project``, ``credentials``, ``service`` and ``discovery_url`` serve TensorFlow's Cloud API
    look-up of a *named* TPU, which stratax does not do: a name is an error saying what to do.

    Args:
      tpu: ``None``/``""``/``"local"``, or the name of this VM's own TPU (``TPU_NAME``).
      job_name: The job name of the hosts in ``cluster_spec()`` (``"worker"``).
      coordinator_address: ``"host:port"`` of the ``jax.distributed`` coordinator of a pod
        slice; default host 0 on port 8482 (JAX's choice).
      emulation_cores: Make this many CPU devices act as TPU cores (testing without a TPU),
        per host when the environment lists several hosts (an emulated pod slice); environment
        equivalent ``STRATAX_TPU_EMULATION=N``. ``None`` reads the variable.

    Example:
      >>> resolver = sx.cluster_resolver.TPUClusterResolver(tpu="")   # on a TPU VM or Colab
      >>> sx.tpu.experimental.initialize_tpu_system(resolver)          # doctest: +SKIP

    Raises:
      ValueError: ``tpu`` names a remote TPU, or a TPU variable is malformed.
    """

    def __init__(
        self,
        tpu: str | None = None,
        zone: str | None = None,
        project: str | None = None,
        job_name: str = "worker",
        coordinator_name: str | None = None,
        coordinator_address: str | None = None,
        credentials: Any = "default",
        service: Any = None,
        discovery_url: str | None = None,
        *,
        emulation_cores: int | None = None,
    ) -> None:
        del zone, project, coordinator_name, credentials, service, discovery_url
        if emulation_cores is not None and (
            isinstance(emulation_cores, bool) or not isinstance(emulation_cores, int)
            or emulation_cores < 1
        ):
            raise ValueError(
                f"emulation_cores must be a positive integer (CPU devices acting as TPU cores) "
                f"or None; received {emulation_cores!r}."
            )
        self._emulation_cores = emulation_cores or emulation_cores_from_env()
        self._tpu = self._check_local(tpu)
        self._task_type = job_name
        launched = bool(self._emulation_cores and os.environ.get(env.STRATAX_PROCESS_ID))
        # An emulated pod started by `stratax launch`: one host per process, numbered and joined
        # by the launcher (its variables), as a TPU VM's environment numbers a slice's hosts.
        self._coordinator_address = coordinator_address or (
            os.environ.get(env.STRATAX_COORDINATOR_ADDRESS, "").strip() or None
            if launched else None)
        self._accelerator_type = os.environ.get(env.TPU_ACCELERATOR_TYPE, "").strip() or None
        if self._accelerator_type:
            parse_accelerator_type(self._accelerator_type)
        processes = (env.get_optional_int(env.STRATAX_NUM_PROCESSES, minimum=1) or 1
                     if launched else 1)
        self._hosts = self._read_hosts() or (["localhost"] * processes if processes > 1 else [])
        self._num_slices = env.get_optional_int(env.MEGASCALE_NUM_SLICES, minimum=1) or 1
        self._slice_id = env.get_optional_int(env.MEGASCALE_SLICE_ID, minimum=0) or 0
        if self._slice_id >= self._num_slices:
            raise ValueError(
                f"{env.MEGASCALE_SLICE_ID}={self._slice_id} is not below "
                f"{env.MEGASCALE_NUM_SLICES}={self._num_slices}; the TPU runtime sets both."
            )
        worker_id = env.get_optional_int(env.TPU_WORKER_ID, minimum=0)
        if worker_id is None and launched:
            worker_id = env.get_optional_int(env.STRATAX_PROCESS_ID, minimum=0)
        if worker_id is not None and self._hosts and worker_id >= len(self._hosts):
            raise ValueError(
                f"{env.TPU_WORKER_ID}={worker_id} is not below the {len(self._hosts)} hosts of "
                f"{env.TPU_WORKER_HOSTNAMES}={','.join(self._hosts)!r}; the two must describe "
                "the same slice."
            )
        if self._hosts and len(self._hosts) > 1 and worker_id is None:
            raise ValueError(
                f"{env.TPU_WORKER_HOSTNAMES} lists {len(self._hosts)} hosts but "
                f"{env.TPU_WORKER_ID} is not set, so this host's place is unknown; set "
                f"{env.TPU_WORKER_ID}=<index of this host> (the TPU VM sets it)."
            )
        self._task_id = worker_id or 0

    @staticmethod
    def _check_local(tpu: str | None) -> str:
        name = os.environ.get(env.TPU_NAME, "").strip() if tpu is None else tpu.strip()
        on_tpu_vm = any(os.environ.get(v, "").strip() for v in _TPU_VM_VARS)
        if name in _LOCAL_NAMES or (on_tpu_vm and tpu is None):
            colab = os.environ.get(env.COLAB_TPU_ADDR, "").strip()
            if colab and not on_tpu_vm:
                raise ValueError(
                    f"{env.COLAB_TPU_ADDR}={colab!r}: this is a legacy Colab TPU reached over "
                    "the network (a TPU Node), which JAX cannot drive. Choose a TPU VM runtime "
                    "in Colab (Runtime > Change runtime type > TPU v2/v5e), then use "
                    "TPUClusterResolver(tpu='')."
                )
            return "local"
        if on_tpu_vm and name == os.environ.get(env.TPU_NAME, "").strip():
            return "local"  # This VM's own TPU, named.
        raise ValueError(
            f"TPUClusterResolver(tpu={tpu!r}) names a TPU reached over the network; finding its "
            "hosts needs a Cloud TPU API call that stratax does not make. Run the program on "
            "the TPU VM itself, on every host of a pod slice, e.g. `gcloud compute tpus tpu-vm "
            f"ssh {name or 'NAME'} --worker=all --command='python train.py'`, with "
            "TPUClusterResolver(tpu='local'); on other machines set "
            f"{env.TPU_WORKER_HOSTNAMES} and {env.TPU_WORKER_ID}, or test without a TPU with "
            f"{env.STRATAX_TPU_EMULATION}=8."
        )

    @staticmethod
    def _read_hosts() -> list[str]:
        raw = (os.environ.get(env.TPU_PROCESS_ADDRESSES, "").strip()
               or os.environ.get(env.TPU_WORKER_HOSTNAMES, "").strip())
        hosts = [h.strip().rsplit(":", 1)[0] if h.count(":") == 1 else h.strip()
                 for h in raw.split(",")] if raw else []
        if any(not h for h in hosts):
            raise ValueError(
                f"{env.TPU_WORKER_HOSTNAMES}={raw!r} has an empty entry; it must list every "
                "host of the slice, comma-separated, e.g. 't1v-n-0,t1v-n-1'."
            )
        return hosts

    # --------------------------------------------------------------- TPU facts
    @property
    def tpu(self) -> str:
        """``"local"``: the TPU attached to this VM (the only kind stratax drives)."""
        return self._tpu

    @property
    def emulation_cores(self) -> int | None:
        """CPU devices acting as TPU cores, or ``None`` (a real TPU is required)."""
        return self._emulation_cores

    @property
    def accelerator_type(self) -> str | None:
        """``TPU_ACCELERATOR_TYPE`` (e.g. ``"v4-16"``), ``None`` when unknown."""
        return self._accelerator_type

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts of this slice, in worker-id order (empty when not stated in the env)."""
        return tuple(self._hosts)

    @property
    def num_slices(self) -> int:
        return self._num_slices

    @property
    def environment(self) -> str:
        """``"emulated"`` under emulation, else ``""`` (TensorFlow's value outside Google)."""
        return "emulated" if self._emulation_cores else ""

    def is_multi_host(self) -> bool:
        """True when several hosts must join (a pod slice, or several slices)."""
        if self._emulation_cores:
            # An emulated pod: processes on this machine stand in for the hosts listed.
            return len(self._hosts) > 1
        if self._hosts:
            return len(self._hosts) * self._num_slices > 1
        if self._num_slices > 1:
            return True
        if self._accelerator_type:
            return parse_accelerator_type(self._accelerator_type)[1] > _SINGLE_HOST_MAX
        return False

    def distributed_init_args(self) -> dict[str, Any] | None:
        """What ``jax.distributed.initialize`` needs to join this slice's hosts.

        Returns:
          ``None`` on a single host (nothing to join); ``{}`` on a pod slice whose hosts are
          not in the environment (``jax.distributed.initialize()`` reads them from the TPU
          VM's metadata server itself); else ``coordinator_address``, ``num_processes`` and
          ``process_id``.
        """
        if not self.is_multi_host():
            return None
        layout = self.explicit_process_layout()
        if layout is None:
            return {}
        return {"coordinator_address": layout.coordinator_address,
                "num_processes": layout.num_processes, "process_id": layout.process_id}

    # --------------------------------------------------------------- resolver API
    def explicit_process_layout(self) -> ProcessLayout | None:
        """The pod's process layout when the environment lists the hosts, else ``None``."""
        if not self._hosts or not self.is_multi_host():
            return None
        per_slice = len(self._hosts)
        coordinator = self._coordinator_address
        if coordinator is None:
            megascale = os.environ.get(env.MEGASCALE_COORDINATOR_ADDRESS, "").strip()
            host = megascale.split(":")[0] if megascale else self._hosts[0]
            coordinator = f"{host}:{TPU_COORDINATOR_PORT}"
        return ProcessLayout(
            coordinator_address=coordinator,
            num_processes=per_slice * self._num_slices,
            process_id=self._slice_id * per_slice + self._task_id,
            task_type=self._task_type,
            task_id=self._task_id,
        )

    def cluster_spec(self) -> ClusterSpec:
        """``{job_name: ["host:8482", ...]}`` for a multi-host slice, else an empty spec."""
        if not self._hosts or not self.is_multi_host() or self._num_slices > 1:
            return ClusterSpec({})
        return ClusterSpec({self._task_type: [f"{h}:{TPU_COORDINATOR_PORT}" for h in self._hosts]})

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """``""`` for the local TPU (TensorFlow's answer for ``tpu="local"``), else a host."""
        if not self.cluster_spec():
            return ""
        return super().master(task_type, task_id, rpc_layer)

    def num_accelerators(self, task_type: str | None = None,
                         task_id: int | None = None) -> dict[str, int]:
        """``{"TPU": cores}`` per host, as far as the environment says (``{}`` if it does not).

        Emulation gives the emulated core count. On a real TPU the count comes from
        ``TPU_CHIPS_PER_PROCESS_BOUNDS`` or a single-host accelerator type; the devices JAX
        finds are the truth (``initialize_tpu_system`` reports them).
        """
        del task_type, task_id
        if self._emulation_cores:
            return {"TPU": self._emulation_cores}
        if not self._accelerator_type:
            return {}
        generation, count = parse_accelerator_type(self._accelerator_type)
        bounds = os.environ.get(env.TPU_CHIPS_PER_PROCESS_BOUNDS, "").strip()
        if bounds:
            chips = 1
            for part in bounds.split(","):
                chips *= env.parse_int(env.TPU_CHIPS_PER_PROCESS_BOUNDS, part, minimum=1)
            return {"TPU": chips * _DEVICES_PER_CHIP.get(generation, 1)}
        if not self.is_multi_host():
            # The name counts TensorCores, except v5e/v6e which count chips; JAX shows one
            # device per megacore chip on v4/v5p.
            return {"TPU": count // 2 if generation in _MEGACORE else count}
        return {}

    def __repr__(self) -> str:
        where = f"emulated with {self._emulation_cores} CPU cores" if self._emulation_cores \
            else f"accelerator_type={self._accelerator_type!r}, hosts={len(self._hosts) or 1}"
        return f"TPUClusterResolver(tpu='local', task_id={self._task_id}, {where})"
