"""Sessions as an attacker meets them (issue 48 item 3): served tasks of a live chief, and a
caller of the same uid (trusted on the local socket) who does not hold the chief's session.

The attacks of the issue: an ``assign`` and a ``shutdown`` without a ``session`` field moved
the loss and stopped a ps mid-run; a second chief's refusal printed the live session id.
"""

import numpy as np
import pytest
from cluster_helpers import local_cluster  # noqa: F401 - a fixture

from stratax._src.parameter_server.tasks.ownership import ChiefSession, SessionError
from stratax._src.parameter_server.transport import rpc

pytestmark = pytest.mark.timeout(120)


def test_calls_without_the_chief_session_change_nothing_and_reveal_nothing(local_cluster):  # noqa: F811
    strategy = local_cluster()
    with strategy.scope():
        v = strategy.create_variable(np.arange(4, dtype=np.float32), name="v")
    session = strategy._session.id
    own = [client.call("ping").meta for client in strategy._ps.clients]  # the chief's calls
    assert sum(meta["shards"] for meta in own) == 1
    intruders = [rpc.RpcClient(f"{job} 0", address, timeout=5) for job, address in
                 (("ps", strategy._ps_addresses[0]), ("ps", strategy._ps_addresses[1]),
                  ("worker", strategy._worker_clients[0].address))]
    try:
        for intruder, forged in zip(intruders, (None, "someone-1-" + "0" * 32, None),
                                    strict=True):
            intruder.session = forged
            for method, meta in (("assign", {"names": ["v"]}), ("pull", {"names": ["v"]}),
                                 ("shutdown", {}), ("export", {"names": ["v"]}),
                                 ("register", {}), ("no_such_call", {})):
                with pytest.raises(rpc.RemoteError, match=f"refused '{method}'") as refused:
                    intruder.call(method, meta, [np.full(4, 9.0, np.float32)])
                assert refused.value.remote_type == "SessionError"
                assert session not in str(refused.value)
            # A bare ping says the task is up, and nothing of its state.
            intruder.session = None
            assert intruder.call("ping").meta == {"ok": True}
        # A second chief is refused with the holder's host and pid, never its session id.
        with pytest.raises(SessionError,
                           match=r"owned by another chief \(the chief on host") as other:
            ChiefSession(intruders[:1], timeout=1.0).claim()
        assert session not in str(other.value) and session.rsplit("-", 1)[1] not in str(
            other.value)
    finally:
        for intruder in intruders:
            intruder.close()
    # The chief's tasks still serve it, with the value it gave.
    np.testing.assert_array_equal(v.numpy(), np.arange(4, dtype=np.float32))
