"""Slurm node-list and tasks-per-node parsing (no scontrol)."""

from __future__ import annotations

import pytest

from stratax._src.cluster.slurm_hostlist import expand_hostlist, expand_tasks_per_node


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[01-04,07],gpu-a[1-2]",
         ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[001-002]", ["n001", "n002"]),
        ("n[3]", ["n3"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("z9,a[2,1]", ["z9", "a2", "a1"]),  # order kept, no sorting
        ("n1,n1", ["n1", "n1"]),  # no deduplication
        ("host.example.com,10.0.0.[1-2]", ["host.example.com", "10.0.0.1", "10.0.0.2"]),
        ("  n[1-2]  ", ["n1", "n2"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    "hostlist, message",
    [
        ("", "node list is empty"),
        ("n[1-2", r"'\[' is never closed"),
        ("n1-2]", r"'\]' without '\['"),
        ("n[1-[2]]", r"nested '\['"),
        ("a,,b", "empty entry"),
        ("a,", "empty entry"),
        ("n[]", r"empty range '\[\]'"),
        ("n[a-b]", r"range 'a-b' is not 'N' or 'N-M'"),
        ("n[1-2-3]", r"range '1-2-3' is not"),
        ("n[5-3]", r"range '5-3' goes down \(5 > 3\)"),
    ],
)
def test_expand_hostlist_errors(hostlist: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand_hostlist(hostlist)


@pytest.mark.parametrize(
    "value, counts",
    [
        ("4", [4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1,2,3", [1, 2, 3]),
        ("8(x2)", [8, 8]),
        ("3(x1)", [3]),
    ],
)
def test_expand_tasks_per_node(value: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(value) == counts


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "entry '' is not 'N' or 'N\\(xK\\)'"),
        ("2(3)", "entry '2\\(3\\)' is not"),
        ("x2", "entry 'x2' is not"),
        ("2(x)", "entry '2\\(x\\)' is not"),
        ("0", "zero count"),
        ("2(x0)", "zero count"),
        ("1,,2", "entry '' is not"),
    ],
)
def test_expand_tasks_per_node_errors(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand_tasks_per_node(value)
