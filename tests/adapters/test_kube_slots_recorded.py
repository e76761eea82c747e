"""``adapters.kube.slots.grants`` as a property: whatever pods a workload's controller made
(any pod set, gated or not, any phase, any slot recorded by a broker before a restart, any
index label), no slot is granted twice nor granted while a live ungated pod records it, a
pod only ever gets a slot of its own pod set, a gated pod keeps the free slot it alone
recorded, and a pod stays gated only when its pod set has no free slot left.
Derandomized, so CI runs the same examples every time. End to end against kmock:
test_kube_workload_pins.py."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.kube.objects import LABEL_POD_SET
from adapters.kube.slots import gated, grants, terminal
from adapters.kube.translate import ANNOTATION_POD
from adapters.kube.workloads import GATE
from broker.manifest.workloads import batchjob
from broker.model import Placement, PodPlacement, Resources
from broker.ports import LaunchSpec

SPEC = LaunchSpec(tenant="acme", job="train")
SETS = {"head": 1, "worker": 2}
PLACEMENT = Placement("acme/train", "east", tuple(
    PodPlacement(f"acme.train-{s}-{i}", f"node-{s}-{i % 2}", (i,), Resources(gpus=1))
    for s, n in SETS.items() for i in range(n)
))  # fmt: skip
SLOT_NAMES = [p.pod for p in PLACEMENT.pods]

pods_strategy = st.lists(
    st.fixed_dictionaries({
        "set": st.sampled_from([*SETS, "other"]),
        "gated": st.booleans(),
        "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
        "recorded": st.one_of(st.none(), st.sampled_from([*SLOT_NAMES, "acme.train-gone-9"])),
        "index": st.one_of(st.none(), st.integers(0, 4)),
    }),
    max_size=8,
)  # fmt: skip


# A pod's index as a batch Job's controller labels it (the registry's answer).
INDEX = functools.partial(batchjob.INTEGRATION.pod_index, {})


def pod(n: int, p: dict[str, Any]) -> dict[str, Any]:
    labels = {LABEL_POD_SET: p["set"]}
    if p["index"] is not None:
        labels["batch.kubernetes.io/job-completion-index"] = str(p["index"])
    notes = {} if p["recorded"] is None else {ANNOTATION_POD: p["recorded"]}
    gates = [{"name": GATE}] if p["gated"] else []
    return {
        "metadata": {"name": f"p{n}", "labels": labels, "annotations": notes,
                     "creationTimestamp": f"2026-01-01T00:00:{n:02d}Z"},
        "spec": {"schedulingGates": gates},
        "status": {"phase": p["phase"]},
    }  # fmt: skip


def slot_set(slot: str) -> str:
    return slot.removeprefix("acme.train-").rpartition("-")[0]


def recorded(p: dict[str, Any]) -> str | None:
    notes: dict[str, str] = p["metadata"]["annotations"]
    return notes.get(ANNOTATION_POD)


def pod_set(p: dict[str, Any]) -> str:
    return str(p["metadata"]["labels"][LABEL_POD_SET])


@settings(max_examples=400, deadline=None, derandomize=True)
@given(pods_strategy)
def test_grants_never_double_book_and_keep_recorded_slots(given_pods: list[dict[str, Any]]) -> None:
    pods = [pod(n, p) for n, p in enumerate(given_pods)]
    out, left = grants(PLACEMENT, SPEC, pods, INDEX)
    granted = {g.name: g.slot.pod for g in out}
    still_gated = {p["metadata"]["name"] for p in left}
    live_gated = {p["metadata"]["name"] for p in pods if gated(p) and not terminal(p)}
    assert granted.keys() | still_gated == live_gated
    assert not granted.keys() & still_gated
    by_name = {p["metadata"]["name"]: p for p in pods}
    assert all(slot_set(slot) == pod_set(by_name[n]) for n, slot in granted.items())
    # never a slot twice, nor one a live pod already runs on (recorded, whatever its pod-set
    # label says now: the pod may run on that slot's node)
    held = {recorded(p) for p in pods if not gated(p) and not terminal(p)
            and recorded(p) in SLOT_NAMES}  # fmt: skip
    assert len(set(granted.values())) == len(granted)
    assert not held & set(granted.values()), (held, granted)
    # a gated pod recording a slot of its pod set that no other live pod records gets it back
    live = Counter(recorded(p) for p in pods if not terminal(p))
    for name in live_gated:
        mine = recorded(by_name[name])
        if mine in SLOT_NAMES and live[mine] == 1 and slot_set(mine) == pod_set(by_name[name]):
            assert granted[name] == mine
    # a pod stays gated only when every slot of its pod set is held or granted
    taken = held | set(granted.values())
    for name in still_gated:
        free = [s for s in SLOT_NAMES if slot_set(s) == pod_set(by_name[name]) and s not in taken]
        assert free == [], (name, free)
