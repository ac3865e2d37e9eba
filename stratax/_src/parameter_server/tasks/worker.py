"""The worker task: runs exported steps on its own batches, pulling and pushing parameters.

A closure from the coordinator names the iterator of each batch it reads (iterators are built
here, by name, from what ``create_per_worker_dataset`` got: see ``worker_input``) and the
runs: each run is an exported program and which batch leaves it takes. For each run the
worker (1) runs the id program if the step reads embedding rows, (2) pulls, in one call per
ps, the variables it reads and only the distinct rows of the tables, (3) runs the step, (4)
pushes gradients with the step id ``"<closure>:<run>"`` (the parameter servers apply each step
id once), and returns the outputs. In asynchronous mode the push of a run and the pull of the
closure's next run travel in one call per ps (the next batch is already here, so its rows are
known). No user Python runs to execute a step. A step's per-worker variables
(``per_worker_variables``) are read from this worker's copies and written back right after
its compute.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import numpy as np

from stratax._src.distributed_input.input_context import InputContext
from stratax._src.parameter_server.inputs import worker_input
from stratax._src.parameter_server.inputs.worker_data import ArrayStore
from stratax._src.parameter_server.per_worker_variables import WorkerCopies
from stratax._src.parameter_server.tasks.exported_steps import (
    Program,
    Reads,
    compute,
    pushes_of,
    reads_of,
)
from stratax._src.parameter_server.tasks.resident import ResidentReplica, averaged, summed
from stratax._src.parameter_server.transport import rpc, structure, wire
from stratax._src.parameter_server.transport.ps_client import PSClients, Push


class _Iterator:
    """A worker-side iterator over ``dataset_fn``'s batches, with its first element peeked."""

    def __init__(self, dataset: Any) -> None:
        self._it = iter(dataset)
        self._peeked: list[Any] = [next(self._it)]
        self.lock = threading.Lock()
        # The batches of the last closure read, so a re-sent closure reads the same ones.
        self._last: tuple[str, list[list[np.ndarray]]] | None = None

    def spec(self) -> tuple[Any, list[np.ndarray]]:
        return structure.describe(self._peeked[0])

    def next(self) -> list[np.ndarray]:
        element = self._peeked.pop() if self._peeked else next(self._it)
        return [np.asarray(leaf) for leaf in structure.describe(element)[1]]

    def take(self, closure: str, count: int) -> list[list[np.ndarray]]:
        """``count`` batches for ``closure``; the same ones again if it is sent again (a
        synchronous share re-run after waiting for a dead worker)."""
        if self._last is None or self._last[0] != closure:
            self._last = (closure, [self.next() for _ in range(count)])
        return self._last[1]


class WorkerService(rpc.Dispatcher):
    """State and request handler of one ``worker`` task."""

    def __init__(self, task_index: int, worker_addresses: Sequence[str],
                 ps_addresses: Sequence[str], timeout: float = 60.0) -> None:
        self.task_index = task_index
        self.num_workers = len(worker_addresses)
        self._ps = PSClients(ps_addresses, timeout)
        self._replica = ResidentReplica(task_index, worker_addresses, timeout)
        self._row_pushes = futures.ThreadPoolExecutor(1, thread_name_prefix="stratax-rows")
        self._rows_in_flight: collections.deque[futures.Future] = collections.deque()
        self._programs: dict[str, Program] = {}
        self._iterators: dict[str, _Iterator] = {}
        self._arrays = ArrayStore()
        self._copies = WorkerCopies(task_index)
        self.shutdown_requested = threading.Event()
        self._methods = {"ping": self._ping, "register": self._register,
                         "iterator": self._iterator, "dataset_spec": self._dataset_spec,
                         "drop_iterator": self._drop_iterator, "run": self._run,
                         "shutdown": self._shutdown, "arrays": self._put_arrays,
                         "drop_arrays": self._drop_arrays,
                         "create_per_worker": self._create_per_worker,
                         "read_per_worker": self._read_per_worker,
                         "resident_load": self._replica.load,
                         "resident_export": self._replica.export,
                         "resident_clear": self._replica.drop,
                         "contribution": self._replica.contribution}

    def close(self) -> None:
        self._row_pushes.shutdown(wait=True)
        self._replica.close()
        self._ps.close()

    def reset(self) -> None:
        """Forgets programs, iterators, arrays and per-worker variables (a new chief session
        took over)."""
        self._programs.clear()
        self._iterators.clear()
        self._arrays = ArrayStore()
        self._copies.clear()
        self._replica.clear()

    def adopt(self, meta: dict[str, Any]) -> None:
        """Takes the chief's ``timeout_seconds`` for this worker's calls to the parameter
        servers (deadline and retries of a ps that does not answer), and its session for the
        calls to the other workers (hybrid mode's exchange), which check it as every task
        does."""
        self._replica.set_session(meta.get("session"))
        timeout = meta.get("timeout_s")
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
            self._ps.set_timeout(float(timeout))
            self._replica.set_timeout(float(timeout))

    def _ping(self, frame: wire.Frame) -> bytes:
        """This task's index and the names of the iterators it holds."""
        return rpc.response({"task": self.task_index, "iterators": sorted(self._iterators)})

    def _shutdown(self, frame: wire.Frame) -> bytes:
        self.shutdown_requested.set()
        return rpc.response()


    def _register(self, frame: wire.Frame) -> bytes:
        meta = wire.require(frame.meta, "program", dict)
        key = wire.require(meta, "key", str)
        if len(frame.tensors) not in (1, 2) or any(t.dtype != np.uint8 for t in frame.tensors):
            raise wire.WireError("register needs 1 or 2 uint8 tensors (step, ids programs).")
        step = frame.tensors[0].tobytes()
        ids = frame.tensors[1].tobytes() if len(frame.tensors) == 2 else None
        if key not in self._programs:
            self._programs[key] = Program(meta, step, ids)
        return rpc.response()

    def _put_arrays(self, frame: wire.Frame) -> bytes:
        self._arrays.put(wire.require(frame.meta, "name", str), frame.tensors)
        return rpc.response()

    def _drop_arrays(self, frame: wire.Frame) -> bytes:
        self._arrays.drop(wire.require(frame.meta, "name", str))
        return rpc.response()

    def _create_per_worker(self, frame: wire.Frame) -> bytes:
        """Creates this worker's copies of per-worker variables from their initial values
        (one tensor per name; copies already here are kept)."""
        names = self._per_worker_names(frame)
        if len(frame.tensors) != len(names):
            raise wire.WireError(f"create_per_worker needs one tensor per name, got "
                                 f"{len(frame.tensors)} for {len(names)}.")
        self._copies.create(names, frame.tensors)
        return rpc.response()

    def _read_per_worker(self, frame: wire.Frame) -> bytes:
        """This worker's current values of the named per-worker variables."""
        return rpc.response({}, self._copies.read(self._per_worker_names(frame)))

    @staticmethod
    def _per_worker_names(frame: wire.Frame) -> list[str]:
        names = wire.require(frame.meta, "names", list)
        if not all(isinstance(n, str) for n in names):
            raise wire.WireError(f"Field 'names' must list variable names, got {names!r}.")
        return names

    def _new_iterator(self, frame: wire.Frame) -> tuple[_Iterator, bytes]:
        """An iterator over the dataset the request describes, and the reply giving the
        structure, dtypes and shapes of its first batch."""
        context = InputContext(num_input_pipelines=self.num_workers,
                               input_pipeline_id=self.task_index, num_replicas_in_sync=1)
        dataset = worker_input.build_dataset(wire.require(frame.meta, "source", dict),
                                             frame.tensors, context)
        iterator = _Iterator(dataset)
        tree, leaves = iterator.spec()
        specs = [[np.asarray(x).dtype.name, list(np.shape(x))] for x in leaves]
        return iterator, rpc.response({"structure": tree, "specs": specs})

    def _iterator(self, frame: wire.Frame) -> bytes:
        name = wire.require(frame.meta, "iterator", str)
        skip = frame.meta.get("skip", 0)
        if type(skip) is not int or skip < 0:
            raise wire.WireError(f"Field 'skip' must be a non-negative int, got {skip!r}.")
        iterator, reply = self._new_iterator(frame)
        for _ in range(skip):  # a restarted worker resumes its data where its steps ended
            iterator.next()
        self._iterators[name] = iterator
        return reply

    def _dataset_spec(self, frame: wire.Frame) -> bytes:
        """``PerWorkerDataset.build()``: builds the dataset, answers its batch structure and
        keeps nothing."""
        return self._new_iterator(frame)[1]

    def _drop_iterator(self, frame: wire.Frame) -> bytes:
        """Releases an iterator the chief's user no longer holds (unknown names are fine)."""
        self._iterators.pop(wire.require(frame.meta, "iterator", str), None)
        return rpc.response()

    def _run(self, frame: wire.Frame) -> bytes:
        closure = wire.require(frame.meta, "closure", str)
        session = frame.meta.get("session")
        if session is not None and not isinstance(session, str):
            raise wire.WireError(f"Field 'session' must be a string, got {session!r}.")
        runs = wire.require(frame.meta, "runs", list)
        timing = {"pull": 0.0, "compute": 0.0, "push": 0.0, "data": 0.0, "exchange": 0.0}
        hybrid = _hybrid(frame.meta.get("hybrid"))
        while self._rows_in_flight:  # left by a failed run: its error was reported then
            self._rows_in_flight.popleft().exception()
        batches: list[list[np.ndarray]] = []
        count = wire.require(frame.meta, "batches", int)
        start = time.perf_counter()
        data = frame.meta.get("data")
        if data is not None:  # batches named by rows of arrays this worker holds
            if not isinstance(data, str) or len(frame.tensors) != count:
                raise wire.WireError(f"run with data {data!r} needs one row tensor per batch.")
            parts = frame.meta.get("sync", 1)
            if isinstance(parts, int) and parts > 1:  # synchronous: this worker's part
                batches = self._arrays.batches(data, frame.tensors, self.task_index, parts)
            else:
                batches = self._arrays.batches(data, frame.tensors)
        elif count:
            batches = self._iterator_batches(closure, frame.meta.get("iterators"), count)
        timing["data"] += time.perf_counter() - start
        sync = wire.require(frame.meta, "sync", int)
        previous = frame.meta.get("after")
        if previous is not None and not isinstance(previous, str):
            raise wire.WireError(f"Field 'after' must be a step id, got {previous!r}.")
        outputs: list[np.ndarray] = []
        counts = []
        steps = []
        for run in runs:
            program = self._programs.get(run.get("program")) if isinstance(run, dict) else None
            if program is None:
                raise KeyError(f"Program {run!r} is not registered on worker {self.task_index}.")
            steps.append((program, [batches[b][leaf] for b, leaf in run["args"]]))
        reads, values = None, None
        for index, (program, leaves) in enumerate(steps):
            t0 = time.perf_counter()
            if values is None:
                reads = reads_of(program, leaves)
                # Synchronous mode: read what the previous step of this closure wrote, once
                # every worker's gradient for it is applied.
                after = (f"{closure}:{index - 1}" if index else previous) if sync > 1 else None
                if hybrid is not None and hybrid["tables"] == "async":
                    after = None
                values = self._pull(program, reads, after, session, f"{closure}:{index}")
            t1 = time.perf_counter()
            grads, result = compute(program, reads, values, leaves,
                                    self._copies.read(program.meta["locals"]))
            local_keys = program.meta["local_assigns"]
            if local_keys:  # this worker's copies: written before the next step reads them
                self._copies.write(local_keys, grads[len(grads) - len(local_keys):])
                grads = grads[:len(grads) - len(local_keys)]
            t2 = time.perf_counter()
            pushes = pushes_of(program, reads, grads)
            step_id = f"{closure}:{index}"
            # New values of non-trained state (BatchNorm statistics, seeds) are written after
            # the push, so a step that has some does not fuse the next step's pull into it.
            assigned = grads[len(program.meta["pushes"]):]
            if hybrid is not None:
                timing["exchange"] += self._hybrid_update(program, step_id, pushes, assigned,
                                                          hybrid, sync, session)
                values = None
            elif sync == 1 and index + 1 < len(steps) and not assigned:
                # Asynchronous: push this step and pull the next one's values in one call per
                # ps (the next step's rows are known: its batch is already here).
                try:
                    reads = reads_of(*steps[index + 1])
                except Exception:
                    self._ps.push(step_id, pushes, sync, self.task_index,
                                  session=session)  # as if unfused
                    raise
                values = self._ps.push(step_id, pushes, sync, self.task_index,
                                       pull=(reads.variables, reads.rows), session=session)
            else:
                self._ps.push(step_id, pushes, sync, self.task_index, session=session)
                values = None
            if assigned and hybrid is None:
                self._ps.assign([program.variables[n] for n in program.meta.get("assigns", [])],
                                assigned, session)
            t3 = time.perf_counter()
            timing["pull"] += t1 - t0
            timing["compute"] += t2 - t1
            timing["push"] += t3 - t2
            counts.append(len(result))
            outputs.extend(result)
        self._drain_row_pushes(0)  # a closure returns once its updates are applied
        return rpc.response({"counts": counts, "timing": timing}, outputs)

    def _pull(self, program: Program, reads: Reads, after: str | None,
              session: str | None, step: str) -> list[np.ndarray]:
        """Step ``step``'s values: resident variables from this worker's replica (hybrid
        mode), the rest from the parameter servers."""
        local = [i for i, v in enumerate(reads.variables) if v["name"] in program.resident]
        if not local:
            return self._ps.pull(reads.variables, reads.rows, after, session, step)
        remote = [i for i in range(len(reads.variables)) if i not in set(local)]
        values: list[Any] = [None] * len(reads.variables)
        for i, value in zip(local, self._replica.read([reads.variables[i] for i in local],
                                                      step), strict=True):
            values[i] = value
        if remote:
            pulled = self._ps.pull([reads.variables[i] for i in remote],
                                   [reads.rows[i] for i in remote], after, session, step)
            for i, value in zip(remote, pulled, strict=True):
                values[i] = value
        return values

    def _hybrid_update(self, program: Program, step_id: str, pushes: list[Push],
                       assigned: list[np.ndarray], hybrid: dict[str, Any], sync: int,
                       session: str | None) -> float:
        """Hybrid mode, after a step's compute: exchanges the resident variables' gradients
        and new values with the other workers and applies their sum to this worker's replica,
        then pushes the tables' rows to the parameter servers (synchronous: summed there over
        the workers; asynchronous: this worker's own update, at most ``max_staleness`` steps
        in flight). Returns the seconds spent in the exchange. The order is what makes a
        re-run exact (see ``resident``)."""
        resident = program.resident
        trained = [(var, grad) for var, _, grad in pushes if var["name"] in resident]
        rows = [push for push in pushes if push[0]["name"] not in resident]
        assigns = [program.variables[n] for n in program.meta.get("assigns", [])]
        local = [(var, value) for var, value in zip(assigns, assigned, strict=True)
                 if var["name"] in resident]
        start = time.perf_counter()
        if (trained or local) and not (
                trained and self._replica.applied(step_id, [v for v, _ in trained])):
            # Keyed by the program too: two strategies of one chief number closures alike.
            got = self._replica.exchange(f"{program.meta['key']}@{step_id}",
                                         [g for _, g in trained] + [x for _, x in local])
            self._replica.update(step_id, [v for v, _ in trained], summed(got, len(trained)),
                                 [v for v, _ in local], averaged(got, len(trained)))
        seconds = time.perf_counter() - start
        if hybrid["tables"] == "sync":
            self._ps.push(step_id, rows, sync, self.task_index, session=session)
        elif rows:
            self._rows_in_flight.append(self._row_pushes.submit(
                self._ps.push, f"{step_id}/w{self.task_index}", rows, 1, self.task_index,
                session=session))
            self._drain_row_pushes(hybrid["max_staleness"])
        remote = [(var, value) for var, value in zip(assigns, assigned, strict=True)
                  if var["name"] not in resident]
        if remote:
            self._ps.assign([v for v, _ in remote], [x for _, x in remote], session)
        return seconds

    def _drain_row_pushes(self, keep: int) -> None:
        """Waits until at most ``keep`` asynchronous row pushes are in flight (raising the
        first one's error)."""
        while len(self._rows_in_flight) > keep:
            self._rows_in_flight.popleft().result()

    def _iterator_batches(self, closure: str, names: Any,
                          count: int) -> list[list[np.ndarray]]:
        """The closure's batches: batch ``i`` is the next one of iterator ``names[i]``."""
        if (not isinstance(names, list) or len(names) != count
                or not all(isinstance(n, str) for n in names)):
            raise wire.WireError(f"Field 'iterators' must name the iterator of each of the "
                                 f"{count} batches, got {names!r}.")
        taken = {}
        for name in dict.fromkeys(names):
            iterator = self._iterators.get(name)
            if iterator is None:
                raise KeyError(f"No iterator {name!r} on worker {self.task_index}.")
            with iterator.lock:
                taken[name] = iter(iterator.take(closure, names.count(name)))
        return [next(taken[name]) for name in names]


def _hybrid(meta: Any) -> dict[str, Any] | None:
    """The run's hybrid-mode settings (``tables``: "sync"/"async", ``max_staleness``)."""
    if meta is None:
        return None
    if (not isinstance(meta, dict) or meta.get("tables") not in ("sync", "async")
            or type(meta.get("max_staleness")) is not int or meta["max_staleness"] < 0):
        raise wire.WireError(f"Field 'hybrid' must be {{'tables': 'sync'|'async', "
                             f"'max_staleness': int >= 0}}, got {meta!r}.")
    return meta
