"""CapiPool against kmock (a Kubernetes API mock over real HTTP) with the real
``kubernetes.aio`` client; no client monkey-patching.

kmock does not serve the ``/scale`` subresource of a custom resource: it ignores the
subresource, so a GET of ``.../machinedeployments/<name>/scale`` answers the whole
MachineDeployment and a PATCH merges its body into it, while a PUT finds no handler (404
Endpoint Not Found); resourceVersions are neither checked nor bumped. ``serve_scale``
scripts the subresource with reactions that read and write the stored MachineDeployment as
the API server does: a Scale (``autoscaling/v1``) view of ``spec.replicas`` with the
object's ``resourceVersion``, and a PUT whose stale ``resourceVersion`` answers 409 Conflict
and whose success bumps it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import kmock as kmocklib
import pytest
from kmock._internal.rendering import Response  # exported by kmock but not in its __all__
from kubernetes.aio.client import ApiClient, Configuration
from tenacity import wait_none

from adapters.capi import CapiPool, CapiPoolError, PoolShape, PoolStatus
from adapters.capi.objects import ANNOTATION_DELETE_MACHINE, ANNOTATION_MACHINE

CANARY = "canary-token-5a1d2e9c44"
NS = "fleet"
NAME = "gpu-md"
MD = kmocklib.resource("cluster.x-k8s.io", "v1beta1", "machinedeployments")
MP = kmocklib.resource("cluster.x-k8s.io", "v1beta1", "machinepools")
MACHINES = kmocklib.resource("cluster.x-k8s.io", "v1beta1", "machines")
NODES = kmocklib.resource("", "v1", "nodes")
SCALE = kmocklib.subresource("scale")
UNAVAILABLE = {"kind": "Status", "code": 503, "reason": "ServiceUnavailable"}

Emulator = kmocklib.KubernetesEmulator


@pytest.fixture
async def k8s(kmock: Any) -> Emulator:
    emulator = cast(Emulator, kmock)
    namespaced = kmocklib.ResourceInfo(namespaced=True)
    emulator.resources["cluster.x-k8s.io/v1beta1/machinedeployments"] = namespaced
    emulator.resources["cluster.x-k8s.io/v1beta1/machinepools"] = namespaced
    emulator.resources["cluster.x-k8s.io/v1beta1/machines"] = namespaced
    emulator.resources["v1/nodes"] = kmocklib.ResourceInfo(namespaced=False)
    return emulator


@pytest.fixture
async def api(k8s: Emulator) -> AsyncIterator[ApiClient]:
    config = Configuration(
        host=str(k8s.url).rstrip("/"),
        api_key={"BearerToken": CANARY},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    async with ApiClient(config) as client:
        yield client


def scale_view(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "resourceVersion": meta["resourceVersion"],
        },
        "spec": {"replicas": obj["spec"]["replicas"]},
        "status": {"replicas": (obj.get("status") or {}).get("readyReplicas", 0)},
    }


def concurrent_write(k8s: Emulator, res: Any, name: str, replicas: int) -> None:
    """Another writer changes the pool: new replicas, new resourceVersion."""
    obj = k8s.objects[res, NS, name]
    version = str(int(obj["metadata"]["resourceVersion"]) + 1)
    obj.patch({"metadata": {"resourceVersion": version}, "spec": {"replicas": replicas}})


def serve_scale(
    k8s: Emulator, res: Any = MD, before_write: Callable[[], None] | None = None
) -> None:
    """The ``/scale`` subresource as the API server serves it (see the module docstring).
    ``before_write`` runs as each PUT arrives: another writer acting between read and write."""

    # A Response returned by a callable sets the status of its reaction for good (a 409 once
    # answered would stick to later answers), so every answer carries its status explicitly.
    def get(request: kmocklib.Request) -> Any:
        key = (res, request.namespace, cast(str, request.name))
        if key not in k8s.objects or k8s.objects[key].deleted:
            status = {"kind": "Status", "code": 404, "reason": "NotFound"}
            return Response(status=404, payload=status)
        return Response(status=200, payload=scale_view(k8s.objects[key].raw))

    def put(request: kmocklib.Request) -> Any:
        name = cast(str, request.name)
        if before_write is not None:
            before_write()
        obj = k8s.objects[res, request.namespace, name]
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        stored = obj["metadata"]["resourceVersion"]
        if sent and sent != stored:
            status = {"kind": "Status", "code": 409, "reason": "Conflict", "message": "modified"}
            return Response(status=409, payload=status)
        concurrent_write(k8s, res, name, int(request.data["spec"]["replicas"]))
        return Response(status=200, payload=scale_view(obj.raw))

    k8s["get"][res][SCALE] << get
    k8s["put"][res][SCALE] << put


def add_pool(
    k8s: Emulator,
    replicas: int = 3,
    annotations: dict[str, str] | None = None,
    res: Any = MD,
    ready: int | None = None,
) -> None:
    obj: dict[str, Any] = {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment" if res == MD else "MachinePool",
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "resourceVersion": "1",
            "annotations": annotations or {},
        },
        "spec": {"replicas": replicas, "clusterName": "east"},
    }
    if ready is not None:
        obj["status"] = {"readyReplicas": ready}
    k8s.objects[res, NS, NAME] = obj


def replicas(k8s: Emulator, res: Any = MD) -> int:
    return int(k8s.objects[res, NS, NAME]["spec"]["replicas"])


def pool(api: ApiClient, **kwargs: Any) -> CapiPool:
    kwargs.setdefault("retry_wait", wait_none())
    return CapiPool(api, NS, NAME, **kwargs)


# -- scaling -----------------------------------------------------------------------------------


async def test_scale_to_and_by_write_the_replicas(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=3)
    serve_scale(k8s)
    capi = pool(api)
    assert await capi.scale_to(5) == 5
    assert replicas(k8s) == 5
    assert await capi.scale_by(2) == 7
    assert replicas(k8s) == 7
    assert await capi.scale_by(-7) == 0
    assert replicas(k8s) == 0
    assert len(k8s["put"][MD][SCALE]) == 3
    sent = next(iter(k8s["put"][MD][SCALE])).data  # the read resourceVersion: a precondition
    assert sent["metadata"]["resourceVersion"] == "1"
    assert sent["spec"] == {"replicas": 5}


async def test_no_write_when_already_there(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=4)
    serve_scale(k8s)
    capi = pool(api)
    assert await capi.scale_to(4) == 4
    assert await capi.scale_by(0) == 4
    assert len(k8s["get"][MD][SCALE]) == 2
    assert len(k8s["put"][MD][SCALE]) == 0
    assert len(k8s["patch"][MD]) == 0
    assert k8s.objects[MD, NS, NAME]["metadata"]["resourceVersion"] == "1"


async def test_negative_and_below_zero_are_refused(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=1)
    serve_scale(k8s)
    capi = pool(api)
    with pytest.raises(ValueError, match="negative"):
        await capi.scale_to(-1)
    with pytest.raises(CapiPoolError, match=r"fleet/gpu-md by -2: would go below 0"):
        await capi.scale_by(-2)
    assert replicas(k8s) == 1
    assert len(k8s["put"][MD][SCALE]) == 0


async def test_machine_pool_kind(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=1, res=MP)
    serve_scale(k8s, MP)
    assert await pool(api, kind="MachinePool").scale_by(3) == 4
    assert replicas(k8s, MP) == 4
    assert len(k8s["put"][MD]) == 0


@pytest.mark.parametrize(("op", "want"), [("to", 6), ("by", 4 + 3)], ids=["scale_to", "scale_by"])
async def test_conflict_is_retried_after_a_re_read(
    api: ApiClient, k8s: Emulator, op: str, want: int
) -> None:
    add_pool(k8s, replicas=3)
    interlopers = [lambda: concurrent_write(k8s, MD, NAME, 4)]  # exactly once

    def interloper() -> None:  # between our first read and write: our write is stale
        if interlopers:
            interlopers.pop()()

    serve_scale(k8s, before_write=interloper)
    capi = pool(api)
    result = await (capi.scale_to(6) if op == "to" else capi.scale_by(3))
    assert result == want
    assert replicas(k8s) == want  # scale_by: from the fresh read (4), not 3 + 3 + 3
    assert len(k8s["get"][MD][SCALE]) == 2
    puts = k8s["put"][MD][SCALE]
    assert len(puts) == 2
    assert [p.data["metadata"]["resourceVersion"] for p in puts] == ["1", "2"]


async def test_conflicts_beyond_the_bound_give_a_clear_error(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=3)
    bump = iter(range(10, 100))
    serve_scale(k8s, before_write=lambda: concurrent_write(k8s, MD, NAME, next(bump)))
    with pytest.raises(CapiPoolError) as caught:
        await pool(api, attempts=3).scale_by(1)
    assert str(caught.value) == (
        "scale machinedeployment fleet/gpu-md by +1: HTTP 409 Conflict after 3 attempts"
    )
    assert len(k8s["put"][MD][SCALE]) == 3


async def test_503_then_success_is_retried(
    api: ApiClient, k8s: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    add_pool(k8s, replicas=3)
    k8s["get"][MD][SCALE][:2] << 503 << UNAVAILABLE
    serve_scale(k8s)
    with caplog.at_level(logging.WARNING):
        assert await pool(api).scale_to(5) == 5
    assert replicas(k8s) == 5
    assert len(k8s["get"][MD][SCALE]) == 3
    assert caplog.text.count("HTTP 503 ServiceUnavailable") == 2
    assert "retrying" in caplog.text


async def test_always_failing_gives_a_clear_error_after_the_attempts(
    api: ApiClient, k8s: Emulator
) -> None:
    add_pool(k8s, replicas=3)
    k8s["put"][MD][SCALE] << 503 << UNAVAILABLE
    serve_scale(k8s)
    with pytest.raises(CapiPoolError) as caught:
        await pool(api).scale_to(5)
    assert str(caught.value) == (
        "scale machinedeployment fleet/gpu-md to 5: HTTP 503 ServiceUnavailable after 6 attempts"
    )
    assert len(k8s["put"][MD][SCALE]) == 6
    assert len(k8s["get"][MD][SCALE]) == 1
    assert replicas(k8s) == 3


async def test_missing_pool_when_scaling(api: ApiClient, k8s: Emulator) -> None:
    serve_scale(k8s)  # no MachineDeployment stored
    with pytest.raises(CapiPoolError, match=r"to 2: no MachineDeployment fleet/gpu-md$"):
        await pool(api).scale_to(2)
    assert len(k8s["get"][MD][SCALE]) == 1  # a 404 is not retried


# -- status ------------------------------------------------------------------------------------


async def test_status_parses_the_scale_from_zero_annotations(api: ApiClient, k8s: Emulator) -> None:
    add_pool(
        k8s,
        replicas=2,
        ready=1,
        annotations={
            "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "8",
            # As the autoscaler's Cluster API provider documents them: gpu-type is the GPU
            # resource name; the model is a node label (the cluster's gpuTypeLabel).
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type": "nvidia.com/gpu",
            "capacity.cluster-autoscaler.kubernetes.io/labels": (
                "topology.kubernetes.io/zone=us-west-2a,nvidia.com/gpu.product=A100-SXM4-80GB"
            ),
            "capacity.cluster-autoscaler.kubernetes.io/cpu": "96",
            "capacity.cluster-autoscaler.kubernetes.io/memory": "1152Gi",
            "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
            "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "10",
            "unrelated": "x",
        },
    )
    assert await pool(api).status() == PoolStatus(
        replicas=2,
        ready_replicas=1,
        shape=PoolShape(
            gpus=8,
            gpu_type="A100-SXM4-80GB",
            cpu_milli=96_000,
            memory_mib=1152 * 1024,
            min_size=0,
            max_size=10,
        ),
    )


@pytest.mark.parametrize(
    ("labels", "label_key", "want"),
    [
        ("nvidia.com/gpu.product=H100", "nvidia.com/gpu.product", "H100"),
        (" a=b , gpu-type = L4 ,", "gpu-type", "L4"),  # blanks and a trailing comma
        ("a=b", "nvidia.com/gpu.product", None),  # not labelled with the model
        ("", "nvidia.com/gpu.product", None),
    ],
)
async def test_status_gpu_model_from_the_labels_annotation(
    api: ApiClient, k8s: Emulator, labels: str, label_key: str, want: str | None
) -> None:
    cap = "capacity.cluster-autoscaler.kubernetes.io/"
    add_pool(k8s, annotations={cap + "gpu-type": "nvidia.com/gpu", cap + "labels": labels})
    assert (await pool(api, gpu_type_label=label_key).status()).shape.gpu_type == want


@pytest.mark.parametrize(
    ("cpu", "memory", "want_cpu", "want_mib"),
    [
        ("500m", "512Mi", 500, 512),
        ("1.5", "2G", 1500, 1907),  # 2e9 bytes = 1907.3 MiB, rounded down
        ("2k", "1Ti", 2_000_000, 1024 * 1024),
        ("4", "1048576Ki", 4000, 1024),
        ("1e2", "1e9", 100_000, 953),  # exponents, as the API server accepts them
    ],
)
async def test_status_quantities(
    api: ApiClient, k8s: Emulator, cpu: str, memory: str, want_cpu: int, want_mib: int
) -> None:
    add_pool(
        k8s,
        annotations={
            "capacity.cluster-autoscaler.kubernetes.io/cpu": cpu,
            "capacity.cluster-autoscaler.kubernetes.io/memory": memory,
        },
    )
    shape = (await pool(api).status()).shape
    assert (shape.cpu_milli, shape.memory_mib) == (want_cpu, want_mib)
    assert (shape.gpus, shape.gpu_type, shape.min_size, shape.max_size) == (None,) * 4


async def test_status_without_annotations_or_ready_replicas(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=0)
    assert await pool(api).status() == PoolStatus(0, 0, PoolShape())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "eight"),
        ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "500m"),
        ("capacity.cluster-autoscaler.kubernetes.io/memory", "12XB"),
        ("capacity.cluster-autoscaler.kubernetes.io/cpu", "-4"),
        ("cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size", "1.5"),
        ("capacity.cluster-autoscaler.kubernetes.io/labels", "A100"),
    ],
)
async def test_status_bad_annotation_is_named(
    api: ApiClient, k8s: Emulator, key: str, value: str
) -> None:
    add_pool(k8s, annotations={key: value})
    with pytest.raises(CapiPoolError) as caught:
        await pool(api).status()
    message = str(caught.value)
    assert message.startswith(f"MachineDeployment fleet/gpu-md: invalid annotation {key}: ")
    assert repr(value) in message or f'"{value}"' in message  # the one parser quotes as JSON


async def test_status_of_a_missing_pool(api: ApiClient, k8s: Emulator) -> None:
    with pytest.raises(CapiPoolError) as caught:
        await pool(api).status()
    assert str(caught.value) == "no MachineDeployment fleet/gpu-md"


async def test_only_v1beta1_served_falls_back_to_it(api: ApiClient, k8s: Emulator) -> None:
    # This module's server serves cluster.x-k8s.io at v1beta1 only (discovery of v1beta2
    # answers 404): every request goes to v1beta1 (tests/adapters/test_capi_v1beta2.py
    # runs the same operations at v1beta2).
    add_pool(k8s, replicas=1, ready=1)
    serve_scale(k8s)
    capi = pool(api)
    assert (await capi.status()).ready_replicas == 1
    assert await capi.scale_by(1) == 2
    assert capi.served.version == "v1beta1"
    assert replicas(k8s) == 2


async def test_no_cluster_api_version_served_is_a_clear_error(
    api: ApiClient, k8s: Emulator
) -> None:
    for version in ("v1beta1",):
        for plural in ("machinedeployments", "machinepools", "machines"):
            del k8s.resources[f"cluster.x-k8s.io/{version}/{plural}"]
    with pytest.raises(CapiPoolError) as caught:
        await pool(api).status()
    assert str(caught.value) == (
        "the management cluster serves none of cluster.x-k8s.io v1beta2, v1beta1 (HTTP 404)"
    )


# -- removing a node ---------------------------------------------------------------------------


def add_node(k8s: Emulator, node: str, machine: str | None, *, unschedulable: bool = False) -> None:
    annotations = {"cluster.x-k8s.io/cluster-namespace": NS}
    if machine is not None:
        annotations[ANNOTATION_MACHINE] = machine
    k8s.objects[NODES, None, node] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "annotations": annotations},
        "spec": {"unschedulable": True} if unschedulable else {},
    }


def add_machine(
    k8s: Emulator, machine: str, node: str | None = None, *, marked: bool = False
) -> None:
    k8s.objects[MACHINES, NS, machine] = {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": {
            "name": machine,
            "namespace": NS,
            "annotations": {ANNOTATION_DELETE_MACHINE: "yes"} if marked else {},
        },
        "spec": {"clusterName": "east"},
        "status": {"nodeRef": {"kind": "Node", "name": node}} if node else {},
    }


def node_of(k8s: Emulator, node: str) -> dict[str, Any]:
    return k8s.objects[NODES, None, node].raw


def machine_of(k8s: Emulator, machine: str) -> dict[str, Any]:
    return k8s.objects[MACHINES, NS, machine].raw


async def test_remove_node_cordons_marks_and_lowers_by_one(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=3)
    serve_scale(k8s)
    add_node(k8s, "node-a", "gpu-md-abc12")
    add_machine(k8s, "gpu-md-abc12", "node-a")
    add_machine(k8s, "gpu-md-def34", "node-b")
    capi = pool(api, workload=api)
    await capi.remove_node("node-a")
    assert node_of(k8s, "node-a")["spec"]["unschedulable"] is True
    assert machine_of(k8s, "gpu-md-abc12")["metadata"]["annotations"] == {
        ANNOTATION_DELETE_MACHINE: "yes"
    }
    assert machine_of(k8s, "gpu-md-def34")["metadata"]["annotations"] == {}
    assert replicas(k8s) == 2
    # a second call finds the work done and does not lower the replicas again
    await capi.remove_node("node-a")
    assert replicas(k8s) == 2
    assert len(k8s["put"][MD][SCALE]) == 1
    assert len(k8s["patch"][NODES]) == 1
    assert len(k8s["patch"][MACHINES]) == 1


async def test_remove_node_gone_from_the_workload_cluster(api: ApiClient, k8s: Emulator) -> None:
    add_pool(k8s, replicas=3)
    serve_scale(k8s)
    add_machine(k8s, "gpu-md-abc12", "node-a")  # its Node is gone already
    capi = pool(api, workload=api)
    await capi.remove_node("node-a")
    assert machine_of(k8s, "gpu-md-abc12")["metadata"]["annotations"] == {
        ANNOTATION_DELETE_MACHINE: "yes"
    }
    assert replicas(k8s) == 2
    assert len(k8s["patch"][NODES]) == 0
    await capi.remove_node("node-a")
    assert replicas(k8s) == 2
    # neither Node nor Machine: an error naming the node
    with pytest.raises(CapiPoolError, match="no Node node-z in the workload cluster"):
        await capi.remove_node("node-z")
    assert replicas(k8s) == 2


async def test_remove_node_marked_by_someone_else_but_not_cordoned(
    api: ApiClient, k8s: Emulator
) -> None:
    add_pool(k8s, replicas=3)
    serve_scale(k8s)
    add_node(k8s, "node-a", "gpu-md-abc12")
    add_machine(k8s, "gpu-md-abc12", "node-a", marked=True)
    await pool(api, workload=api).remove_node("node-a")
    assert node_of(k8s, "node-a")["spec"]["unschedulable"] is True
    assert len(k8s["patch"][MACHINES]) == 0  # already marked: no second patch
    assert replicas(k8s) == 2


@pytest.mark.parametrize("setup", ["no-annotation", "no-machine"])
async def test_remove_node_without_its_machine_changes_nothing(
    api: ApiClient, k8s: Emulator, setup: str
) -> None:
    add_pool(k8s, replicas=3)
    serve_scale(k8s)
    add_node(k8s, "node-a", None if setup == "no-annotation" else "gpu-md-gone")
    add_machine(k8s, "gpu-md-abc12", "node-a")
    with pytest.raises(CapiPoolError) as caught:
        await pool(api, workload=api).remove_node("node-a")
    assert "node node-a" in str(caught.value)
    expected = (
        "no cluster.x-k8s.io/machine annotation"
        if setup == "no-annotation"
        else ("names Machine fleet/gpu-md-gone, which does not exist")
    )
    assert expected in str(caught.value)
    assert "unschedulable" not in node_of(k8s, "node-a")["spec"]
    assert machine_of(k8s, "gpu-md-abc12")["metadata"]["annotations"] == {}
    assert replicas(k8s) == 3
    assert len(k8s["patch"]) == 0
    assert len(k8s["put"]) == 0


async def test_remove_node_needs_a_workload_client(api: ApiClient, k8s: Emulator) -> None:
    with pytest.raises(CapiPoolError, match="remove node node-a: no workload cluster client"):
        await pool(api).remove_node("node-a")
    assert len(k8s) == 0


# -- secrets -----------------------------------------------------------------------------------


async def test_canary_token_never_logged_nor_in_errors(
    api: ApiClient, k8s: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    add_pool(k8s, replicas=3, annotations={"capacity.cluster-autoscaler.kubernetes.io/cpu": "x"})
    add_node(k8s, "node-a", "gpu-md-abc12")
    add_machine(k8s, "gpu-md-abc12", "node-a")
    k8s["get"][MD][SCALE] << 503 << UNAVAILABLE
    k8s["patch"][NODES] << 500 << {"kind": "Status", "code": 500, "reason": "InternalError"}
    capi = pool(api, workload=api, attempts=2)
    texts: list[str] = [repr(capi)]
    calls: list[Callable[[], Any]] = [
        lambda: capi.scale_to(5),
        lambda: capi.scale_by(1),
        lambda: capi.remove_node("node-a"),
        capi.status,
    ]
    with caplog.at_level(logging.DEBUG):
        for call in calls:
            with pytest.raises(CapiPoolError) as caught:
                await call()
            texts += [str(caught.value), repr(caught.value), repr(caught.value.__cause__)]
    assert "HTTP 503 ServiceUnavailable after 2 attempts" in texts[1]
    assert "cordon: HTTP 500 InternalError after 2 attempts" in texts[7]
    # the token did go over the wire...
    assert all(CANARY in r.headers.get("Authorization", "") for r in k8s)
    # ...but never into logs or errors
    assert caplog.records
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(logging.Formatter().format(record))
    assert not [t for t in texts if CANARY in t]


def add_coming(k8s: Emulator, machine: str, created: str, node: str | None = None) -> None:
    """A Machine of the pool's MachineDeployment; without ``node`` still provisioning."""
    add_machine(k8s, machine, node)
    k8s.objects[MACHINES, NS, machine].patch(
        {"metadata": {"labels": {"cluster.x-k8s.io/deployment-name": NAME},
                      "creationTimestamp": created}}
    )  # fmt: skip


async def test_cancel_coming_marks_only_machines_without_a_node(
    api: ApiClient, k8s: Emulator
) -> None:
    add_pool(k8s, replicas=4)
    serve_scale(k8s)
    add_coming(k8s, "m-up", "2026-11-29T10:00:00Z", node="n-up")  # up: may run pods
    add_coming(k8s, "m-old", "2026-11-29T10:01:00Z")
    add_coming(k8s, "m-new", "2026-11-29T10:02:00Z")
    add_machine(k8s, "m-other")  # another pool's: no deployment label
    assert await pool(api).cancel_coming(1) == 1
    assert replicas(k8s) == 3
    assert machine_of(k8s, "m-new")["metadata"]["annotations"][ANNOTATION_DELETE_MACHINE] == "yes"
    assert ANNOTATION_DELETE_MACHINE not in machine_of(k8s, "m-old")["metadata"]["annotations"]
    # Asked for more than are provisioning: only those, never the machine with a node.
    assert await pool(api).cancel_coming(5) == 2
    assert replicas(k8s) == 1
    for name in ("m-up", "m-other"):
        assert ANNOTATION_DELETE_MACHINE not in machine_of(k8s, name)["metadata"]["annotations"]
