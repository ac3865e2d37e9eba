"""One parameter-server round trip over gRPC vs the same-host Unix socket: CPU and wall per call.

A server process (``RpcServer``, an echo handler: the request's tensors back) and this process
as client; each call sends a float32 tensor of each ``--kb`` size and receives it back (400 KB:
the MLP benchmark's per-step push and pull; 1300 KB: the embedding benchmark's row gradients).
Per transport and repetition: ``--calls`` calls after a warm-up; client CPU from
``time.process_time``, server CPU from the server's own ``process_time`` (asked over the same
client), wall from ``time.perf_counter``. Repetitions interleave the two transports; the table
gives medians and the 1-minute load average.

    python -m benchmarks.internals.ps_transport  # 400 and 1300 KB; writes results/ps_transport.md
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import textwrap
import time

import numpy as np

from benchmarks import RESULTS_DIR
from benchmarks.harness.report import round_trip_table, write_table
from stratax._src.parameter_server.transport import rpc

RESULTS = RESULTS_DIR
_SERVER = textwrap.dedent("""
    import sys, time
    from stratax._src.parameter_server.transport import rpc, rpc_server

    def handle(frame):
        if frame.meta["method"] == "cpu":
            return rpc.response({"cpu": time.process_time()})
        return rpc.response({}, frame.tensors)

    rpc.keep_buffers_in_heap()   # as a ps task does (server.py)
    server = rpc_server.RpcServer("echo", "127.0.0.1", 0, handle)
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()             # until the benchmark closes our stdin
    server.stop(0)
""")


def _measure(client: rpc.RpcClient, payload: np.ndarray, calls: int) -> dict:
    for _ in range(20):
        client.call("echo", tensors=[payload])
    server0, cpu0, wall0 = client.call("cpu").meta["cpu"], time.process_time(), time.perf_counter()
    for _ in range(calls):
        client.call("echo", tensors=[payload])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    server = client.call("cpu").meta["cpu"] - server0
    return {"wall_ms": 1e3 * wall / calls, "client_cpu_ms": 1e3 * cpu / calls,
            "server_cpu_ms": 1e3 * server / calls, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kb", default="400,1300", help="request (= reply) sizes in KB")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rpc.keep_buffers_in_heap()
    # gRPC calls need the shared token (the local socket checks the caller's uid instead).
    token = secrets.token_urlsafe(32)
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, STRATAX_PS_TOKEN=token))
    try:
        port = int(server.stdout.readline())
        clients = {t: rpc.RpcClient("echo", f"127.0.0.1:{port}", 30, token=token, transport=t)
                   for t in ("grpc", "auto")}
        for client in clients.values():
            client.wait_ready(30)
        sizes = [int(kb) for kb in args.kb.split(",")]
        runs: dict[str, list[dict]] = {f"{kb}:{t}": [] for kb in sizes for t in clients}
        for kb in sizes:
            payload = np.random.default_rng(0).normal(size=kb * 256).astype(np.float32)
            for _ in range(args.reps):
                for transport, client in clients.items():
                    runs[f"{kb}:{transport}"].append(_measure(client, payload, args.calls))
        used = {t: c.transport for t, c in clients.items()}
        for client in clients.values():
            client.close()
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
    lines = round_trip_table(
        "# One round trip: gRPC vs the same-host Unix socket",
        f"{args.calls} calls per repetition, {args.reps} repetitions interleaved, medians; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores.",
        "transport", runs, lambda transport: f"{transport} ({used[transport]})")
    write_table(RESULTS, "ps_transport", lines, runs)


if __name__ == "__main__":
    main()
