"""Slot grants for a workload's gated pods (``adapters.kube.slots``, pure): properties over
any mix of pods a controller may have made, and the merge patch that ungates one."""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapters.kube.objects import LABEL_POD_SET
from adapters.kube.pods import ANNOTATION_SLOT
from adapters.kube.slots import Grant, gated, grants, no_slot_event, terminal, ungate_patch
from adapters.kube.translate import ANNOTATION_GPUS, ANNOTATION_POD
from adapters.kube.workloads import GATE
from broker.manifest.workloads import batchjob
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec

SPEC = LaunchSpec(tenant="acme", job="train", pod_sets=("leader", "worker"))
GPU = Resources(gpus=2)


# A pod's index as a batch Job's controller labels it (the registry's answer).
INDEX = functools.partial(batchjob.INTEGRATION.pod_index, {})


def placement(sets: dict[str, int]) -> Placement:
    pods = tuple(
        PodPlacement(f"acme.train-{ps}-{i}", f"node-{ps}-{i // 2}", (i % 2 * 2, i % 2 * 2 + 1), GPU)
        for ps, n in sets.items()
        for i in range(n)
    )
    return Placement("acme/train", "east", pods)


def pod(
    name: str,
    pod_set: str,
    *,
    gate: bool = True,
    phase: str = "Pending",
    slot: str | None = None,
    index: int | None = None,
) -> dict[str, Any]:
    labels = {LABEL_POD_SET: pod_set}
    if index is not None:
        labels[batchjob.COMPLETION_INDEX] = str(index)
    annotations = {ANNOTATION_POD: slot} if slot else {}
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if gate:
        spec["schedulingGates"] = [{"name": "other.io/gate"}, {"name": GATE}]
    return {
        "metadata": {"name": name, "namespace": "team-acme", "labels": labels,
                     "annotations": annotations, "resourceVersion": "7", "uid": f"uid-{name}"},
        "spec": spec,
        "status": {"phase": phase},
    }  # fmt: skip


POD_SETS = ("leader", "worker")


def recorded_slot(pod_set: str, i: int | None) -> str | None:
    """A slot a pod records: its own pod set's (i >= 0), a worker's whatever its pod set
    (i < 0: labels and record disagree), or none."""
    if i is None:
        return None
    return f"acme.train-{pod_set if i >= 0 else 'worker'}-{abs(i)}"


pods_strategy = st.lists(
    st.builds(
        lambda i, ps, g, phase, slot_i, index: pod(
            f"p{i}", ps, gate=g, phase=phase, slot=recorded_slot(ps, slot_i), index=index
        ),
        st.integers(0, 10_000),
        st.sampled_from(POD_SETS),
        st.booleans(),
        st.sampled_from(["Pending", "Pending", "Running", "Succeeded", "Failed"]),
        st.one_of(st.none(), st.integers(-3, 5)),
        st.one_of(st.none(), st.integers(0, 5)),
    ),
    max_size=14,
    unique_by=lambda p: p["metadata"]["name"],
)


def holders(pods: list[dict[str, Any]], slots: set[str]) -> dict[str, list[str]]:
    """slot -> the pods past the gate, not ended, recording it (what may run on its node)."""
    out: dict[str, list[str]] = {}
    for p in pods:
        recorded = p["metadata"]["annotations"].get(ANNOTATION_POD)
        if not terminal(p) and not gated(p) and recorded in slots:
            out.setdefault(recorded, []).append(p["metadata"]["name"])
    return out


def apply(pods: list[dict[str, Any]], given_: list[Grant]) -> list[dict[str, Any]]:
    """The pods after the grants' patches: slot recorded, our gate gone."""
    by_name = {g.name: g for g in given_}
    out = []
    for p in pods:
        grant = by_name.get(p["metadata"]["name"])
        if grant is not None:
            patch = ungate_patch(grant, SPEC)
            meta = {**p["metadata"], "annotations": patch["metadata"]["annotations"]}
            gates = patch["spec"]["schedulingGates"] or []
            p = {**p, "metadata": meta, "spec": {**p["spec"], "schedulingGates": gates}}
        out.append(p)
    return out


@given(pods_strategy, st.integers(0, 4), st.integers(0, 4))
def test_grants_never_double_book_a_slot_and_leave_no_slot_idle(
    pods: list[dict[str, Any]], leaders: int, workers: int
) -> None:
    plan = placement({"leader": leaders, "worker": workers})
    slots = {p.pod: p for p in plan.pods}
    made, left = grants(plan, SPEC, pods, INDEX)
    waiting = [p for p in pods if gated(p) and not terminal(p)]
    assert len(made) + len(left) == len(waiting)
    assert len({g.slot.pod for g in made}) == len(made)  # a slot granted once
    for grant in made:
        assert gated(grant.pod) and not terminal(grant.pod)
        assert grant.slot.pod in slots
        assert grant.slot.pod.startswith(
            f"acme.train-{grant.pod['metadata']['labels'][LABEL_POD_SET]}-"
        )
    after = apply(pods, made)
    held = holders(after, set(slots))
    # No slot (a node's share of GPUs) is held by two ungated pods because of a grant.
    granted = {g.slot.pod for g in made}
    assert all(len(held[s]) == 1 for s in granted)
    # A pod stays gated only when every slot of its pod set is held.
    for p in left:
        pod_set = p["metadata"]["labels"][LABEL_POD_SET]
        of_set = [s for s in slots if s.startswith(f"acme.train-{pod_set}-")]
        assert all(s in held for s in of_set)
    # Granting again from the patched pods changes nothing for the pods granted.
    again, _ = grants(plan, SPEC, after, INDEX)
    assert not {g.name for g in again} & {g.name for g in made}


@given(pods_strategy, st.integers(1, 4))
def test_a_gated_pod_keeps_the_free_slot_it_recorded(pods: list[dict[str, Any]], n: int) -> None:
    plan = placement({"worker": n})
    me = pod("me", "worker", slot=f"acme.train-worker-{n - 1}")
    others = [
        p
        for p in pods
        if p["metadata"]["annotations"].get(ANNOTATION_POD)
        != me["metadata"]["annotations"][ANNOTATION_POD]
    ]
    made, _ = grants(plan, SPEC, [me, *others], INDEX)
    assert [g.slot.pod for g in made if g.name == "me"] == [f"acme.train-worker-{n - 1}"]


def test_pods_take_the_slot_of_their_own_index_and_extras_stay_gated() -> None:
    plan = placement({"worker": 3})
    pods = [pod(f"js-w-0-{i}", "worker", index=i) for i in (2, 0, 1, 3)]
    made, left = grants(plan, SPEC, pods, INDEX)
    assert {g.name: g.slot.pod for g in made} == {
        "js-w-0-0": "acme.train-worker-0",
        "js-w-0-1": "acme.train-worker-1",
        "js-w-0-2": "acme.train-worker-2",
    }
    assert [p["metadata"]["name"] for p in left] == ["js-w-0-3"]


def test_a_finished_pod_frees_its_slot_for_the_next() -> None:
    plan = placement({"worker": 1})
    done = pod("a", "worker", gate=False, phase="Failed", slot="acme.train-worker-0")
    running = pod("b", "worker", gate=False, phase="Running", slot="acme.train-worker-0")
    retry = pod("c", "worker")
    assert [g.slot.pod for g in grants(plan, SPEC, [done, retry], INDEX)[0]] == [
        "acme.train-worker-0"
    ]
    made, left = grants(plan, SPEC, [running, retry], INDEX)
    assert made == [] and [p["metadata"]["name"] for p in left] == ["c"]


def test_the_ungate_patch_pins_records_and_keeps_other_gates() -> None:
    plan = placement({"worker": 2})
    p = pod("js-w-0-1", "worker", index=1)
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [zone]}]}
    p["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
    }
    patch = ungate_patch(Grant(p, plan.pods[1]), SPEC)
    assert patch["metadata"] == {
        "resourceVersion": "7",
        "annotations": {ANNOTATION_SLOT: "worker-1", ANNOTATION_POD: "acme.train-worker-1",
                        ANNOTATION_GPUS: "2,3"},
    }  # fmt: skip
    assert patch["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]
    (term,) = patch["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
    assert term["matchExpressions"][0]["key"] == "zone"  # the user's requirement kept (ANDed)
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["node-worker-0"]}
    ]
    only_ours = pod("x", "worker")
    only_ours["spec"]["schedulingGates"] = [{"name": GATE}]
    assert ungate_patch(Grant(only_ours, plan.pods[0]), SPEC)["spec"]["schedulingGates"] is None


def test_the_no_slot_event_names_the_pod_and_its_pod_set() -> None:
    event = no_slot_event(pod("js-w-0-3", "worker"), SPEC, "fedbroker", "2026-12-02T00:00:00Z")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "js-w-0-3",
                                       "namespace": "team-acme", "uid": "uid-js-w-0-3"}  # fmt: skip
    assert event["type"] == "Warning" and event["reason"] == "FedbrokerNoSlot"
    assert "'worker'" in event["message"] and "train" in event["message"]
    assert event["metadata"] == {"name": "js-w-0-3.fedbroker-no-slot", "namespace": "team-acme"}
