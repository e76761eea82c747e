"""Stranded GPUs (policies.stranded): free GPUs on a node where no pod of any waiting job
fits, one row per reason a pod does not fit, and the cases where nothing is stranded."""

from __future__ import annotations

import pytest
from builders import ClusterSpec, federation, gang, node, occupy, shared, single

from broker.model import Job
from policies.stranded import fit_shapes, stranded_gpus


def _stranded(spec: ClusterSpec, waiting: list[Job]) -> float:
    """Stranded GPUs of cluster "c": one 8-GPU A100 node with 5 GPUs taken by a foreign
    pod, ``waiting`` the pending jobs."""
    ledger = federation({"c": spec})
    occupy(ledger, "c", "n", list(range(5)))
    shapes = frozenset().union(*(fit_shapes(j) for j in waiting))
    return stranded_gpus(ledger.snapshot(), shapes).get(("c", "A100"), 0.0)


A_NODE = ClusterSpec([node("n")])
CASES = [
    # (case, cluster, waiting jobs, stranded GPUs of the node's 3 free)
    ("nothing waits: idle is not stranded", A_NODE, [], 0.0),
    ("a pod of 2 fits", A_NODE, [single("s", 2)], 0.0),
    ("pods of 4 only", A_NODE, [single("s", 4), gang("g", pods=2, gpus=8)], 3.0),
    ("one fitting pod among many is enough", A_NODE, [single("big", 4), single("s", 1)], 0.0),
    ("a share fits a free GPU", A_NODE, [shared("x", 500)], 0.0),
    ("only T4 wanted", A_NODE, [single("s", 1, gpu_types=["T4"])], 3.0),
    ("A100 among those wanted", A_NODE, [single("s", 1, gpu_types=["T4", "A100"])], 0.0),
    ("another cluster's label wanted", A_NODE, [single("s", 1, selector={"zone": "b"})], 3.0),
    ("this cluster's label wanted", ClusterSpec([node("n")], labels={"zone": "b"}),
     [single("s", 1, selector={"zone": "b"})], 0.0),
    ("a taint not tolerated", ClusterSpec([node("n", taints=["gpu-maint"])]), [single("s")], 3.0),
    ("the taint tolerated", ClusterSpec([node("n", taints=["gpu-maint"])]),
     [single("s", tolerations=["gpu-maint"])], 0.0),
    ("too little CPU left", ClusterSpec([node("n", cpu=2_000)]), [single("s", cpu=4_000)], 3.0),
    ("too little memory left", ClusterSpec([node("n", mem=1_000)]), [single("s", mem=2_000)], 3.0),
    ("a stale cluster takes no work and strands none", ClusterSpec([node("n")], stale=True),
     [single("s", 4)], 0.0),
    ("an unschedulable node strands none", ClusterSpec([node("n", unschedulable=True)]),
     [single("s", 4)], 0.0),
    ("CPU-only pods strand nothing", A_NODE, [single("cpu", 0)], 0.0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spec", "waiting", "expected"), CASES, ids=[c[0] for c in CASES])
def test_stranded_gpus(case: str, spec: ClusterSpec, waiting: list[Job], expected: float) -> None:
    assert _stranded(spec, waiting) == expected, case


def test_a_shared_gpu_strands_its_free_share_when_no_share_fits() -> None:
    """Whole-GPU pods cannot use a partly taken GPU: its free share counts, in GPUs."""
    ledger = federation({"c": [node("n", gpus=1)]})
    occupy(ledger, "c", "n", [0], milli=250)
    whole = fit_shapes(single("s", 1))
    assert stranded_gpus(ledger.snapshot(), whole) == {("c", "A100"): 0.75}
    assert stranded_gpus(ledger.snapshot(), whole | fit_shapes(shared("x", 500))) == {}


def test_jobs_alike_have_one_shape() -> None:
    """What the queue counts: two jobs alike but in name share their shapes; a pod set
    without GPUs has none."""
    assert fit_shapes(gang("a", pods=4, gpus=2)) == fit_shapes(gang("b", pods=2, gpus=2))
    assert fit_shapes(single("a", 2)) != fit_shapes(single("b", 2, gpu_types=["T4"]))
    assert fit_shapes(single("cpu", 0)) == frozenset()
