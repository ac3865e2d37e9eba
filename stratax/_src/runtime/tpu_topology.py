"""``Topology`` and ``DeviceAssignment``: TensorFlow's description of a TPU slice, on JAX devices.

A TPU slice is a grid of chips, each with one or more TensorCores. TensorFlow describes it with
a 4-D *mesh shape* ``[x, y, z, cores_per_chip]`` and places each replica of a computation on a
block of that grid (``DeviceAssignment``): ``computation_shape`` is the block one replica
occupies, so ``computation_shape=[1, 1, 1, 2]`` gives each replica the two cores of a chip
(two *logical cores*, for model parallelism). The same objects here hold JAX devices: on a TPU
their ``coords``/``core_on_chip``; under emulation, CPU devices laid out as chips of two cores
(like v2/v3) when their number is even.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

TOPOLOGY_RANK = 4  # x, y, z, core on chip


def device_coordinates(device: Any, index: int, cores_per_chip: int) -> tuple[int, int, int, int]:
    """``(x, y, z, core)`` of a device: a TPU's own, or a CPU device's place when emulated."""
    coords = getattr(device, "coords", None)
    if device.platform == "tpu" and coords is not None:
        x, y, z = [*list(coords), 0, 0, 0][:3]
        return int(x), int(y), int(z), int(getattr(device, "core_on_chip", 0))
    return index // cores_per_chip, 0, 0, index % cores_per_chip


class Topology:
    """The slice's mesh of cores and which task (host) owns which device.

    Returned by ``sx.tpu.experimental.initialize_tpu_system``; TensorFlow's ``tf.tpu.Topology``.

    Example:
        >>> topology = sx.tpu.experimental.initialize_tpu_system(resolver)
        >>> topology.mesh_shape, topology.num_tasks, topology.num_tpus_per_task
        (array([4, 1, 1, 2]), 1, 8)
    """

    def __init__(self, devices: Sequence[Any], emulated: bool = False) -> None:
        if not devices:
            raise ValueError("A Topology needs at least one device; received none.")
        self._devices = list(devices)
        self._emulated = emulated
        cores_per_chip = 2 if emulated and len(devices) % 2 == 0 else 1
        coords = np.array([device_coordinates(d, i, cores_per_chip)
                           for i, d in enumerate(self._devices)], dtype=np.int32)
        self._mesh_shape = coords.max(axis=0) + 1
        self._by_coords = {tuple(c): d for c, d in zip(coords.tolist(), self._devices, strict=True)}
        tasks = sorted({d.process_index for d in self._devices})
        per_task = [[c for c, d in zip(coords, self._devices, strict=True) if d.process_index == t]
                    for t in tasks]
        if len({len(p) for p in per_task}) != 1:
            raise RuntimeError(
                f"TPU hosts own different numbers of cores ({[len(p) for p in per_task]}); every "
                "host of a slice must run the program with all its TPU chips visible."
            )
        self._device_coordinates = np.array(per_task, dtype=np.int32)
        self._tasks = tasks

    @property
    def mesh_shape(self) -> np.ndarray:
        """``[x, y, z, cores_per_chip]``: the size of the slice's core grid."""
        return self._mesh_shape.copy()

    @property
    def mesh_rank(self) -> int:
        return TOPOLOGY_RANK

    @property
    def device_coordinates(self) -> np.ndarray:
        """``(num_tasks, num_tpus_per_task, 4)`` coordinates of each task's devices."""
        return self._device_coordinates.copy()

    @property
    def num_tasks(self) -> int:
        """Hosts (processes) of the slice."""
        return len(self._tasks)

    @property
    def num_tpus_per_task(self) -> int:
        """TPU devices (cores JAX shows) per host."""
        return self._device_coordinates.shape[1]

    @property
    def missing_devices(self) -> np.ndarray:
        """Coordinates of the grid with no device (empty on a healthy slice)."""
        grid = itertools.product(*(range(int(n)) for n in self._mesh_shape))
        return np.array([c for c in grid if c not in self._by_coords], dtype=np.int32).reshape(
            -1, TOPOLOGY_RANK)

    @property
    def devices(self) -> tuple[Any, ...]:
        """The JAX devices of the slice, in JAX's order."""
        return tuple(self._devices)

    @property
    def emulated(self) -> bool:
        """True when CPU devices stand in for TPU cores."""
        return self._emulated

    def device_at_coordinates(self, coordinates: Sequence[int]) -> Any:
        """The JAX device at ``(x, y, z, core)``.

        Raises:
            ValueError: no device sits there.
        """
        key = tuple(int(c) for c in coordinates)
        if key not in self._by_coords:
            raise ValueError(
                f"No TPU core at coordinates {list(key)}; the mesh shape is "
                f"{self._mesh_shape.tolist()}."
            )
        return self._by_coords[key]

    def task_ordinal_at_coordinates(self, coordinates: Sequence[int]) -> int:
        """The task (host) that owns the core at ``coordinates``."""
        return self._tasks.index(self.device_at_coordinates(coordinates).process_index)

    def tpu_device_ordinal_at_coordinates(self, coordinates: Sequence[int]) -> int:
        """The index of that core among its task's devices."""
        task = self.task_ordinal_at_coordinates(coordinates)
        own = self._device_coordinates[task].tolist()
        return own.index([int(c) for c in coordinates])

    def tpu_device_name_at_coordinates(self, coordinates: Sequence[int],
                                       job: str | None = None) -> str:
        """TensorFlow's name of that core, e.g. ``"/job:worker/task:0/device:TPU:3"``."""
        task = self.task_ordinal_at_coordinates(coordinates)
        ordinal = self.tpu_device_ordinal_at_coordinates(coordinates)
        return f"/job:{job or 'worker'}/task:{task}/device:TPU:{ordinal}"

    def __repr__(self) -> str:
        kind = ", emulated" if self._emulated else ""
        return (f"Topology(mesh_shape={self._mesh_shape.tolist()}, num_tasks={self.num_tasks}, "
                f"num_tpus_per_task={self.num_tpus_per_task}{kind})")


def _as_shape(value: Sequence[int] | None, name: str, default: int) -> np.ndarray:
    if value is None:
        return np.full(TOPOLOGY_RANK, default, dtype=np.int32)
    shape = np.asarray(value, dtype=np.int64).reshape(-1)
    if shape.size != TOPOLOGY_RANK or (shape < 1).any():
        raise ValueError(
            f"{name} must be {TOPOLOGY_RANK} positive integers [x, y, z, cores_per_chip]; "
            f"received {list(value)!r}, e.g. {name}=[1, 1, 1, 2] for two cores of a chip."
        )
    return shape.astype(np.int32)


class DeviceAssignment:
    """Which cores each replica of a computation runs on: ``(replicas, logical cores)``.

    TensorFlow's ``tf.tpu.experimental.DeviceAssignment``; pass it to
    ``sx.TPUStrategy(resolver, experimental_device_assignment=...)``.

    Example:
        >>> topology = sx.tpu.experimental.initialize_tpu_system(resolver)
        >>> assignment = sx.tpu.experimental.DeviceAssignment.build(
        ...     topology, computation_shape=[1, 1, 1, 2], num_replicas=4)
        >>> assignment.num_replicas, assignment.num_cores_per_replica
        (4, 2)
    """

    def __init__(self, topology: Topology, core_assignment: np.ndarray) -> None:
        assignment = np.asarray(core_assignment, dtype=np.int32)
        if assignment.ndim != 3 or assignment.shape[2] != TOPOLOGY_RANK:
            raise ValueError(
                "core_assignment must have shape (num_replicas, num_cores_per_replica, 4); "
                f"received shape {assignment.shape}."
            )
        devices = [topology.device_at_coordinates(c) for c in assignment.reshape(-1, 4)]
        if len(set(devices)) != len(devices):
            raise ValueError("core_assignment uses a core twice; each core serves one replica.")
        self._topology = topology
        self._assignment = assignment
        self._devices = np.array(devices, dtype=object).reshape(assignment.shape[:2])

    @staticmethod
    def build(
        topology: Topology,
        computation_shape: Sequence[int] | None = None,
        computation_stride: Sequence[int] | None = None,
        num_replicas: int = 1,
    ) -> DeviceAssignment:
        """Tiles the slice with blocks of ``computation_shape`` cores, one block per replica.

        Args:
            topology: From ``initialize_tpu_system``.
            computation_shape: ``[x, y, z, cores]`` one replica occupies (default one core).
            computation_stride: Spacing of a replica's cores in each dimension (default 1).
            num_replicas: How many replicas (the first ones in row-major block order).

        Raises:
            ValueError: the shape does not tile the mesh, or too many replicas are asked for.
        """
        shape = _as_shape(computation_shape, "computation_shape", 1)
        stride = _as_shape(computation_stride, "computation_stride", 1)
        mesh = topology.mesh_shape
        span = shape * stride
        if (mesh % span).any():
            raise ValueError(
                f"computation_shape {shape.tolist()} with stride {stride.tolist()} does not tile "
                f"the TPU mesh {mesh.tolist()}; each dimension of shape*stride must divide it."
            )
        bases = [np.array(block) * span + np.array(offset)
                 for block in itertools.product(*(range(int(n)) for n in mesh // span))
                 for offset in itertools.product(*(range(int(s)) for s in stride))]
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or not (
                1 <= num_replicas <= len(bases)):
            raise ValueError(
                f"num_replicas={num_replicas!r} does not fit: the mesh {mesh.tolist()} holds "
                f"1 to {len(bases)} replicas of computation_shape {shape.tolist()}."
            )
        offsets = [np.array(k) * stride for k in itertools.product(*(range(int(s)) for s in shape))]
        assignment = np.array([[base + k for k in offsets] for base in bases[:num_replicas]])
        return DeviceAssignment(topology, assignment)

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def num_replicas(self) -> int:
        return int(self._assignment.shape[0])

    @property
    def num_cores_per_replica(self) -> int:
        """Logical cores of each replica (the size of the strategy's ``"core"`` mesh axis)."""
        return int(self._assignment.shape[1])

    @property
    def core_assignment(self) -> np.ndarray:
        """``(num_replicas, num_cores_per_replica, 4)`` core coordinates."""
        return self._assignment.copy()

    def coordinates(self, replica: int, logical_core: int) -> tuple[int, ...]:
        """The ``(x, y, z, core)`` of one replica's logical core."""
        return tuple(int(c) for c in self._assignment[replica, logical_core])

    def lookup_replicas(self, task_id: int, logical_core: int) -> list[int]:
        """Replicas whose ``logical_core`` lives on task ``task_id``.

        Raises:
            ValueError: no replica has that logical core on that task.
        """
        found = [r for r in range(self.num_replicas)
                 if self._topology.task_ordinal_at_coordinates(
                     self.coordinates(r, logical_core)) == task_id]
        if not found:
            raise ValueError(f"No replica has logical core {logical_core} on task {task_id}.")
        return found

    def tpu_ordinal(self, replica: int = 0, logical_core: int = 0) -> int:
        """The index, among its host's devices, of one replica's logical core."""
        return self._topology.tpu_device_ordinal_at_coordinates(
            self.coordinates(replica, logical_core))

    def tpu_device(self, replica: int = 0, logical_core: int = 0, job: str | None = None) -> str:
        """TensorFlow's name of one replica's logical core."""
        return self._topology.tpu_device_name_at_coordinates(
            self.coordinates(replica, logical_core), job)

    def devices(self) -> np.ndarray:
        """``(num_replicas, num_cores_per_replica)`` array of JAX devices (the strategy's mesh)."""
        return self._devices.copy()

    def __repr__(self) -> str:
        return (f"DeviceAssignment(num_replicas={self.num_replicas}, "
                f"num_cores_per_replica={self.num_cores_per_replica})")
