"""The ledger in delegate mode: a member's gang scheduler binds a reserved pod where it
likes, and the reservation follows the pod there, so the pod is counted once, where it
runs; guesses not bound yet give way by moving to the room it left, never by evicting a
job for its own pods (or for another delegated gang's); reality still wins when nothing
can move."""

from __future__ import annotations

from builders import federation as make_federation
from builders import node
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.ledger import Ledger
from broker.model import Placement, PodBound, PodDeleted, PodPlacement, Resources

GPU8 = Resources(gpus=8, cpu_milli=1_000, memory_mib=1_024)


def federation(nodes: int, gpus: dict[str, int] | None = None) -> Ledger:
    """Member ``east``: nodes n1..n<nodes>, 8 GPUs each unless ``gpus`` says otherwise."""
    sizes = gpus or {}
    names = [f"n{i}" for i in range(1, nodes + 1)]
    return make_federation({"east": [node(n, sizes.get(n, 8)) for n in names]})


def gang(ledger: Ledger, job: str, pods: dict[str, str], res: Resources = GPU8) -> Placement:
    """Reserve ``job``'s pods (name -> node), each on its node's first GPUs."""
    placement = Placement(
        job, "east", tuple(PodPlacement(p, n, tuple(range(res.gpus)), res) for p, n in pods.items())
    )
    ledger.assume(placement)
    return placement


def used(ledger: Ledger) -> dict[str, int]:
    """Node -> GPUs counted taken there (bound and reserved), nodes with none left out."""
    view = ledger.snapshot().clusters["east"]
    out = {n: len(s.gpu_free) - s.whole_free for n, s in view.nodes.items()}
    return {n: g for n, g in out.items() if g}


def two_node_gang() -> tuple[Ledger, Placement]:
    ledger = federation(nodes=2)
    placement = gang(
        ledger, "acme/train", {"acme.train-master-0": "n1", "acme.train-worker-0": "n2"}
    )
    return ledger, placement


def test_a_reserved_pod_bound_elsewhere_is_counted_where_it_runs() -> None:
    ledger = federation(nodes=3)
    gang(ledger, "acme/train", {"acme.train-master-0": "n1", "acme.train-worker-0": "n2"})
    assert ledger.apply(PodBound("east", "acme.train-master-0", "n3", GPU8)) == []
    assert used(ledger) == {"n2": 8, "n3": 8}
    assert ledger.counted("east", "acme.train-master-0") == ("n3", tuple(range(8)))


def test_a_gang_scheduler_swapping_a_gangs_pods_evicts_nothing() -> None:
    ledger, placement = two_node_gang()
    assert ledger.apply(PodBound("east", "acme.train-master-0", "n2", GPU8)) == []
    assert used(ledger) == {"n1": 8, "n2": 8}  # the worker's guess moved to n1
    assert ledger.counted("east", "acme.train-worker-0") == ("n1", tuple(range(8)))
    assert ledger.apply(PodBound("east", "acme.train-worker-0", "n1", GPU8)) == []
    assert used(ledger) == {"n1": 8, "n2": 8}
    assert "acme/train" in ledger.reservations()
    ledger.confirm("acme/train")
    ledger.release("acme/train", placement)
    assert used(ledger) == {}


def test_another_gangs_guess_moves_out_of_the_way() -> None:
    ledger = federation(nodes=4)
    gang(ledger, "acme/a", {"acme.a-w-0": "n1", "acme.a-w-1": "n2"})
    gang(ledger, "acme/b", {"acme.b-w-0": "n3", "acme.b-w-1": "n4"})
    # The scheduler puts a's pods on the nodes the broker gave b: b's guesses take a's.
    assert ledger.apply(PodBound("east", "acme.a-w-0", "n4", GPU8)) == []
    assert ledger.apply(PodBound("east", "acme.a-w-1", "n3", GPU8)) == []
    assert used(ledger) == {f"n{i}": 8 for i in range(1, 5)}
    assert {ledger.counted("east", p)[0] for p in ("acme.b-w-0", "acme.b-w-1")} == {"n1", "n2"}  # type: ignore[index]
    assert set(ledger.reservations()) == {"acme/a", "acme/b"}


def test_a_bound_pod_never_moves_and_reality_still_wins() -> None:
    ledger = federation(nodes=2)
    gang(ledger, "acme/a", {"acme.a-w-0": "n1"})
    ledger.apply(PodBound("east", "other/x", "n2", GPU8))  # someone else's pod on n2
    # a's pod lands on the full n2 anyway: nothing there is a guess, so nothing moves.
    assert ledger.apply(PodBound("east", "acme.a-w-0", "n2", GPU8)) == []
    assert ledger.counted("east", "other/x") == ("n2", tuple(range(8)))
    assert ledger.counted("east", "acme.a-w-0") is not None
    assert used(ledger) == {"n2": 8}  # overcommitted, clamped: what reality says


def test_a_guess_that_fits_nowhere_it_could_move_is_evicted() -> None:
    ledger = federation(nodes=2, gpus={"n1": 4})
    gang(ledger, "acme/a", {"acme.a-w-0": "n1"}, Resources(gpus=4, cpu_milli=1, memory_mib=1))
    gang(ledger, "acme/b", {"acme.b-w-0": "n2"})
    # a's 4-GPU pod lands on n2: b's 8-GPU guess cannot take the 4 GPUs a left on n1.
    half = Resources(gpus=4, cpu_milli=1, memory_mib=1)
    assert ledger.apply(PodBound("east", "acme.a-w-0", "n2", half)) == ["acme/b"]
    assert used(ledger) == {"n2": 4}


def test_a_snapshot_without_a_job_gives_back_where_its_pods_are_counted() -> None:
    ledger, placement = two_node_gang()
    ledger.apply(PodBound("east", "acme.train-master-0", "n2", GPU8))
    ledger.confirm("acme/train")
    view = ledger.snapshot_without([placement]).clusters["east"]
    assert {n: s.whole_free for n, s in view.nodes.items()} == {"n1": 8, "n2": 8}


def test_a_pod_deleted_frees_the_node_it_ran_on() -> None:
    ledger, _ = two_node_gang()
    ledger.apply(PodBound("east", "acme.train-master-0", "n2", GPU8))
    ledger.apply(PodBound("east", "acme.train-worker-0", "n1", GPU8))
    ledger.confirm("acme/train")
    ledger.apply(PodDeleted("east", "acme.train-master-0"))
    assert used(ledger) == {"n1": 8}


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 5), st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=12))
def test_every_pod_is_counted_once_wherever_it_is_bound(
    nodes: int, binds: list[tuple[int, int]]
) -> None:
    """Gangs of one 8-GPU pod a node fill the member; a gang scheduler binds their pods,
    each to a node no bound pod holds (it sees the pods, not the broker's reservations),
    in any order. No job is ever evicted, each node counts at most its 8 GPUs, and the
    GPUs counted are always every pod's once: bound where it runs, or a guess."""
    ledger = federation(nodes=nodes)
    pods = [f"acme.j{i}-w-0" for i in range(nodes)]
    for i, pod in enumerate(pods):
        gang(ledger, f"acme/j{i}", {pod: f"n{i + 1}"})
    bound: dict[str, str] = {}
    for which, where in binds:
        pod = pods[which % nodes]
        free = [f"n{i}" for i in range(1, nodes + 1) if f"n{i}" not in bound.values()]
        if pod in bound or not free:
            continue
        node_name = free[where % len(free)]
        assert ledger.apply(PodBound("east", pod, node_name, GPU8)) == []
        bound[pod] = node_name
        assert ledger.counted("east", pod) == (node_name, tuple(range(8)))
        assert used(ledger) == {f"n{i}": 8 for i in range(1, nodes + 1)}
        assert set(ledger.reservations()) == {f"acme/j{i}" for i in range(nodes)}
