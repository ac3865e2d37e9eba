"""What the cluster's mutual TLS costs one gRPC round trip, against plaintext gRPC and the AEAD's
own floor: CPU per call on each side.

A raw gRPC echo server (another process; the same channel options as ``transport.rpc``) takes
each call plaintext (as gRPC calls went before issue 48) or over ``cluster_tls``'s mutual TLS;
this process is the client. Each call sends ``--kb`` kilobytes and gets them back (1 KB: what
a call costs besides its bytes; 400 KB: the MLP benchmark's per-step push and pull; 1300 KB:
the embedding benchmark's rows), so each side encrypts one copy and decrypts one. The floor is
this machine's AES-128-GCM (the suite the client offers first, printed from its ClientHello)
and ChaCha20-Poly1305 sealing and opening that many bytes in one piece (``cryptography``,
OpenSSL). Client CPU from ``time.process_time``, server CPU from the server's own (asked after
the calls), wall from ``time.perf_counter``; repetitions interleave the two modes; medians.

    python -m benchmarks.internals.ps_tls      # 1, 400 and 1300 KB; writes results/ps_tls.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import grpc

from benchmarks import RESULTS_DIR
from benchmarks.harness.report import round_trip_table, write_table
from stratax._src.parameter_server.transport import cluster_tls, rpc

RESULTS = RESULTS_DIR
_TOKEN = "benchmark-cluster-key-" + "0" * 32
_SERVER = textwrap.dedent(f"""
    import sys, time
    from concurrent import futures
    import grpc
    from stratax._src.parameter_server.transport import cluster_tls, rpc

    def echo(request, context):
        return str(time.process_time()).encode() if request == b"cpu" else request

    rpc.keep_buffers_in_heap()   # as a ps task does
    server = grpc.server(futures.ThreadPoolExecutor(8), options=rpc.GRPC_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {{"Call": grpc.unary_unary_rpc_method_handler(echo)}}),))
    if sys.argv[1] == "tls":
        port = server.add_secure_port("127.0.0.1:0", cluster_tls.server_credentials({_TOKEN!r}))
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()             # until the benchmark closes our stdin
""")
_SUITES = {"1301": "TLS_AES_128_GCM_SHA256", "1302": "TLS_AES_256_GCM_SHA384",
           "1303": "TLS_CHACHA20_POLY1305_SHA256"}


def _channel(mode: str, port: int) -> grpc.Channel:
    if mode == "tls":
        return grpc.secure_channel(f"127.0.0.1:{port}", cluster_tls.channel_credentials(_TOKEN),
                                   options=[*rpc._CLIENT_OPTIONS, ("grpc.ssl_target_name_override",
                                                                   cluster_tls.TARGET_NAME)])
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=rpc._CLIENT_OPTIONS)


def _measure(mode: str, size: int, calls: int) -> dict:
    server = subprocess.Popen([sys.executable, "-c", _SERVER, mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        channel = _channel(mode, int(server.stdout.readline()))
        call = channel.unary_unary("/bench.Echo/Call")
        payload = os.urandom(size)
        for _ in range(20):
            call(payload, timeout=30)
        server0, cpu0, wall0 = float(call(b"cpu")), time.process_time(), time.perf_counter()
        for _ in range(calls):
            call(payload, timeout=30)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        server_cpu = float(call(b"cpu")) - server0
        channel.close()
    finally:
        server.stdin.close()
        server.wait(30)
    return {"wall_ms": 1e3 * wall / calls, "client_cpu_ms": 1e3 * cpu / calls,
            "server_cpu_ms": 1e3 * server_cpu / calls, "load": os.getloadavg()[0]}


def _aead_floor_ms(size: int, reps: int = 30) -> dict[str, float]:
    """Milliseconds to seal and open ``size`` bytes once each, per AEAD (the least one side of
    a call spends on its crypto)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    data, nonce = os.urandom(size), os.urandom(12)
    floors = {}
    for name, aead in (("AES-128-GCM", AESGCM(os.urandom(16))),
                       ("ChaCha20-Poly1305", ChaCha20Poly1305(os.urandom(32)))):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            aead.decrypt(nonce, aead.encrypt(nonce, data, None), None)
            times.append(time.perf_counter() - start)
        floors[name] = 1e3 * statistics.median(times)
    return floors


def _offered_suites() -> list[str]:
    """The TLS 1.3 suites a cluster client offers, in its order (read from its ClientHello)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        channel = _channel("tls", listener.getsockname()[1])

        def knock():
            with contextlib.suppress(grpc.RpcError):  # nobody answers the handshake
                channel.unary_unary("/bench.Echo/Call")(b"", timeout=5)

        knocker = threading.Thread(target=knock, daemon=True)
        knocker.start()
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            hello = b""
            while len(hello) < 5 or len(hello) < 5 + int.from_bytes(hello[3:5], "big"):
                hello += conn.recv(1 << 16)
        channel.close()
    at = 5 + 4 + 2 + 32  # record and handshake headers, version, random
    at += 1 + hello[at]  # session id
    count = int.from_bytes(hello[at:at + 2], "big")
    codes = [hello[at + 2 + i:at + 4 + i].hex() for i in range(0, count, 2)]
    return [_SUITES[c] for c in codes if c in _SUITES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kb", default="1,400,1300", help="request (= reply) sizes in KB")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    suites = _offered_suites()
    sizes = [int(kb) for kb in args.kb.split(",")]
    runs: dict[str, list[dict]] = {f"{kb}:{m}": [] for kb in sizes for m in ("plain", "tls")}
    floors = {}
    for kb in sizes:
        for _ in range(args.reps):
            for mode in ("plain", "tls"):
                runs[f"{kb}:{mode}"].append(_measure(mode, kb * 1000, args.calls))
        floors[kb] = _aead_floor_ms(kb * 1000)
    lines = round_trip_table(
        "# One gRPC round trip: plaintext vs the cluster's mutual TLS",
        f"{args.calls} calls per repetition, {args.reps} repetitions interleaved, medians; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores. "
        f"The client offers {', '.join(suites)} (in that order).", "mode", runs)
    lines += ["", "The floor: sealing and opening that many bytes once (what each side's crypto "
              "costs at least per call), ms:", "",
              "| KB | " + " | ".join(next(iter(floors.values()))) + " |",
              "| ---: |" + " ---: |" * len(next(iter(floors.values())))]
    lines += [f"| {kb} | " + " | ".join(f"{ms:.3f}" for ms in f.values()) + " |"
              for kb, f in floors.items()]
    write_table(RESULTS, "ps_tls", lines, {"runs": runs, "floors_ms": floors,
                                           "offered_suites": suites})


if __name__ == "__main__":
    main()
