"""Which processes share a host, and when the hierarchical all-reduce fits them."""

import pytest

from stratax._src.runtime import host_groups, shm_collectives


def test_processes_group_by_identity_in_order_of_their_lowest_id():
    hosts = host_groups.group(["b", "a", "b", "a"])
    assert hosts.members == ((0, 2), (1, 3))
    assert [hosts.host_of(p) for p in range(4)] == [0, 1, 0, 1]
    assert [hosts.local_rank(p) for p in range(4)] == [0, 0, 1, 1]
    assert hosts.peer(2, 1) == 3 and hosts.peer(1, 0) == 0
    assert host_groups.hierarchy_problem(hosts) == ""


@pytest.mark.parametrize("identities, problem", [
    (["a", "b"], "span 2 hosts with one process each"),
    (["a", "a", "b"], "unequal numbers of processes (2, 1)"),
])
def test_layouts_without_a_hierarchy_say_why(identities, problem):
    assert problem in host_groups.hierarchy_problem(host_groups.group(identities))


def test_the_host_identity_tells_network_namespaces_apart():
    """Two namespaces on one machine (containers, the two-host test bed) are two hosts."""
    import os

    name, boot, network = shm_collectives._host_identity().split("/", 2)
    assert network == os.readlink("/proc/self/ns/net") and name and boot
