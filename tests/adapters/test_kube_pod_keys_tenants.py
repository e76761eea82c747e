"""Two tenants' jobs of the same name, whose controllers name their pods alike in each
tenant's namespace (a PyTorchJob's ``train-worker-0``): the watcher's keys
(``translate.PodKeys``) keep them apart, each under its own tenant's ledger names, and a pod
released frees its own key only."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapters.kube.translate import PodKeys, own_name

TENANTS = ("team-a", "team-b")


def pod(tenant: str, name: str) -> dict[str, Any]:
    """A delegated pod of job ``train``'s pod set ``worker`` (our labels, no slot)."""
    labels = {"fedbroker.io/origin": "fedbroker", "fedbroker.io/tenant": tenant,
              "fedbroker.io/job": "train", "fedbroker.io/pod-set": "worker"}  # fmt: skip
    meta = {"name": name, "namespace": f"fedbroker-{tenant}", "labels": labels}
    return {"metadata": meta, "spec": {"nodeName": "n1"}}


def test_same_named_pods_of_two_tenants_are_keyed_under_each_tenant() -> None:
    keys = PodKeys()
    a, b = pod("team-a", "train-worker-0"), pod("team-b", "train-worker-0")
    assert (keys.hold(a), keys.hold(b)) == ("team-a.train-worker-0", "team-b.train-worker-0")
    keys.release(own_name(a))
    assert keys.hold(b) == "team-b.train-worker-0"  # b's key kept, not freed with a's
    assert keys.hold(pod("team-a", "train-worker-1")) == "team-a.train-worker-0"


# (hold or release, tenant, pod name)
STEPS = st.lists(
    st.tuples(st.booleans(), st.sampled_from(TENANTS), st.sampled_from(("w-0", "w-1", "w-2"))),
    max_size=30,
)


@given(STEPS)
def test_live_pods_hold_distinct_keys_of_their_own_tenant(
    steps: list[tuple[bool, str, str]],
) -> None:
    keys = PodKeys()
    live: dict[str, tuple[str, str]] = {}  # namespace/name -> (tenant, key)
    for hold, tenant, name in steps:
        obj = pod(tenant, name)
        if hold:
            live[own_name(obj)] = (tenant, keys.hold(obj))
        else:
            keys.release(own_name(obj))
            live.pop(own_name(obj), None)
        held = [key for _, key in live.values()]
        assert len(set(held)) == len(held), live
        assert all(key.startswith(f"{t}.train-worker-") for t, key in live.values()), live
