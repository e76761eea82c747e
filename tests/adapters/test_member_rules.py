"""The test member's API server rules (tests/kube_admission.py and the modules it calls):
one row per body a real kube-apiserver refuses, with the status and the exact field it
names; what it accepts and how it stores it (defaults, canonical quantities, pruning); and,
through HTTP, that a refusal reaches the client as the server's ``Status``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import kmock as kmocklib
import pytest
from kmock_namespaces import NamespacedEmulator
from kube_admission import Kind, create, update

POD = Kind("", "v1", "pods")
JOB = Kind("batch", "v1", "jobs")
JOBSET = Kind("jobset.x-k8s.io", "v1alpha2", "jobsets")
PODS = kmocklib.resource("", "v1", "pods")
NAMESPACES = kmocklib.resource("", "v1", "namespaces")
Edit = Callable[[dict[str, Any]], object]


def pod(**spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox:stable",
        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [container], **spec},
    }


def job(**spec: Any) -> dict[str, Any]:
    template = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:stable"}],
        }
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"template": template, **spec},
    }


def c0(p: dict[str, Any]) -> dict[str, Any]:
    return p["spec"]["containers"][0]  # type: ignore[no-any-return]


def jc0(j: dict[str, Any]) -> dict[str, Any]:
    return j["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def edited(body: dict[str, Any], edit: Edit) -> dict[str, Any]:
    out = copy.deepcopy(body)
    edit(out)
    return out


# (case, kind, body, HTTP status, the field the server names -- for a 400: in its message)
REFUSED: list[tuple[str, Kind, dict[str, Any], int, str]] = [
    (
        "pod name not a DNS subdomain",
        POD,
        edited(pod(), lambda p: p["metadata"].update(name="Train_0")),
        422,
        "metadata.name",
    ),
    (
        "pod without a name",
        POD,
        edited(pod(), lambda p: p["metadata"].pop("name")),
        422,
        "metadata.name",
    ),
    (
        "label key with two slashes",
        POD,
        edited(pod(), lambda p: p["metadata"].update(labels={"a/b/c": "x"})),
        422,
        "metadata.labels[a/b/c]",
    ),
    (
        "label value too long",
        POD,
        edited(pod(), lambda p: p["metadata"].update(labels={"team": "x" * 64})),
        422,
        "metadata.labels[team]",
    ),
    (
        "label value with a space",
        POD,
        edited(pod(), lambda p: p["metadata"].update(labels={"team": "a b"})),
        422,
        "metadata.labels[team]",
    ),
    (
        "annotation key not a qualified name",
        POD,
        edited(pod(), lambda p: p["metadata"].update(annotations={"bad key": "x"})),
        422,
        "metadata.annotations",
    ),
    (
        "annotations over 256 KiB",
        POD,
        edited(pod(), lambda p: p["metadata"].update(annotations={"big": "x" * 262142})),
        422,
        "metadata.annotations",
    ),
    ("no containers", POD, pod(containers=[]), 422, "spec.containers"),
    (
        "container name not a DNS label",
        POD,
        edited(pod(), lambda p: c0(p).update(name="Main")),
        422,
        "spec.containers[0].name",
    ),
    (
        "container name twice",
        POD,
        edited(pod(), lambda p: p["spec"].update(initContainers=[{"name": "main", "image": "i"}])),
        422,
        "spec.containers[0].name",
    ),
    (
        "container without image",
        POD,
        edited(pod(), lambda p: c0(p).pop("image")),
        422,
        "spec.containers[0].image",
    ),
    (
        "quantity that does not parse",
        POD,
        edited(pod(), lambda p: c0(p)["resources"]["limits"].update(cpu="one")),
        400,
        "spec.containers.resources.limits",
    ),
    (
        "negative quantity",
        POD,
        edited(pod(), lambda p: c0(p)["resources"]["limits"].update(cpu="-1")),
        422,
        "spec.containers[0].resources.limits[cpu]",
    ),
    (
        "request above limit",
        POD,
        edited(pod(), lambda p: c0(p)["resources"].update(requests={"cpu": "2"})),
        422,
        "spec.containers[0].resources.requests[cpu]",
    ),
    (
        "GPU request below its limit",
        POD,
        edited(
            pod(),
            lambda p: (
                c0(p)["resources"]["requests"].update({"nvidia.com/gpu": "0"})
                if c0(p)["resources"].setdefault("requests", {}) is not None
                else None
            ),
        ),
        422,
        "spec.containers[0].resources.requests[nvidia.com/gpu]",
    ),
    (
        "fractional GPU",
        POD,
        edited(pod(), lambda p: c0(p)["resources"]["limits"].update({"nvidia.com/gpu": "0.5"})),
        422,
        "spec.containers[0].resources.limits[nvidia.com/gpu]",
    ),
    (
        "GPU requested without a limit",
        POD,
        edited(pod(), lambda p: c0(p).update(resources={"requests": {"nvidia.com/gpu": "1"}})),
        422,
        "spec.containers[0].resources.limits",
    ),
    (
        "resource name without a domain",
        POD,
        edited(pod(), lambda p: c0(p)["resources"]["limits"].update(gpu="1")),
        422,
        "spec.containers[0].resources.limits[gpu]",
    ),
    ("restartPolicy unknown", POD, pod(restartPolicy="Sometimes"), 422, "spec.restartPolicy"),
    (
        "env name with '='",
        POD,
        edited(pod(), lambda p: c0(p).update(env=[{"name": "A=B", "value": "x"}])),
        422,
        "spec.containers[0].env[0].name",
    ),
    (
        "containerPort zero",
        POD,
        edited(pod(), lambda p: c0(p).update(ports=[{"containerPort": 0}])),
        422,
        "spec.containers[0].ports[0].containerPort",
    ),
    (
        "containerPort above 65535",
        POD,
        edited(pod(), lambda p: c0(p).update(ports=[{"containerPort": 70000}])),
        422,
        "spec.containers[0].ports[0].containerPort",
    ),
    (
        "containerPort a name",
        POD,
        edited(pod(), lambda p: c0(p).update(ports=[{"containerPort": "http"}])),
        400,
        "spec.containers.ports.containerPort",
    ),
    (
        "port name too long",
        POD,
        edited(
            pod(),
            lambda p: c0(p).update(ports=[{"containerPort": 80, "name": "a-very-long-port-name"}]),
        ),
        422,
        "spec.containers[0].ports[0].name",
    ),
    (
        "terminationGracePeriodSeconds a string",
        POD,
        pod(terminationGracePeriodSeconds="30"),
        400,
        "spec.terminationGracePeriodSeconds",
    ),
    (
        "scheduling gate twice",
        POD,
        pod(schedulingGates=[{"name": "a.io/g"}, {"name": "a.io/g"}]),
        422,
        "spec.schedulingGates[1].name",
    ),
    (
        "scheduling gate not a qualified name",
        POD,
        pod(schedulingGates=[{"name": "a b"}]),
        422,
        "spec.schedulingGates[0].name",
    ),
    (
        "nodeName beside a gate",
        POD,
        pod(nodeName="n1", schedulingGates=[{"name": "a.io/g"}]),
        422,
        "spec.nodeName",
    ),
    (
        "ephemeral container on create",
        POD,
        pod(ephemeralContainers=[{"name": "dbg", "image": "i"}]),
        422,
        "spec.ephemeralContainers",
    ),
    ("hostname not a DNS label", POD, pod(hostname="Rank_0"), 422, "spec.hostname"),
    (
        "toleration Exists with a value",
        POD,
        pod(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
        422,
        "spec.tolerations[0].operator",
    ),
    (
        "node field selector of two nodes",
        POD,
        pod(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}
                                ]
                            }
                        ]
                    }
                }
            }
        ),
        422,
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values",
    ),
    (
        "mount of no volume",
        POD,
        edited(pod(), lambda p: c0(p).update(volumeMounts=[{"name": "data", "mountPath": "/d"}])),
        422,
        "spec.containers[0].volumeMounts[0].name",
    ),
    (
        "namespace other than the URL's",
        POD,
        edited(pod(), lambda p: p["metadata"].update(namespace="other")),
        400,
        "namespace",
    ),
    (
        "Job template restartPolicy defaulted to Always",
        JOB,
        edited(job(), lambda j: j["spec"]["template"]["spec"].pop("restartPolicy")),
        422,
        "spec.template.spec.restartPolicy",
    ),
    (
        "Job Indexed without completions",
        JOB,
        job(completionMode="Indexed", parallelism=2),
        422,
        "spec.completions",
    ),
    (
        "Job Indexed of 100,001",
        JOB,
        job(completionMode="Indexed", completions=100_001),
        422,
        "spec.completions",
    ),
    ("Job completionMode unknown", JOB, job(completionMode="Ordered"), 422, "spec.completionMode"),
    ("Job negative backoffLimit", JOB, job(backoffLimit=-1), 422, "spec.backoffLimit"),
    ("Job negative parallelism", JOB, job(parallelism=-1), 422, "spec.parallelism"),
    (
        "Job name too long for its job-name label",
        JOB,
        edited(job(), lambda j: j["metadata"].update(name="j" * 64)),
        422,
        "spec.template.metadata.labels[job-name]",
    ),
    (
        "Job selector not matching its template",
        JOB,
        job(manualSelector=True, selector={"matchLabels": {"app": "x"}}),
        422,
        "spec.template.metadata.labels",
    ),
    (
        "Job template containerPort a name",
        JOB,
        edited(job(), lambda j: jc0(j).update(ports=[{"containerPort": "http"}])),
        400,
        "spec.template.spec.containers.ports.containerPort",
    ),
    (
        "Job template container name not a DNS label",
        JOB,
        edited(job(), lambda j: jc0(j).update(name="Main")),
        422,
        "spec.template.spec.containers[0].name",
    ),
]


@pytest.mark.parametrize(
    ("case", "kind", "body", "code", "where"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_the_member_refuses_what_the_api_server_refuses(
    case: str, kind: Kind, body: dict[str, Any], code: int, where: str
) -> None:
    review = create(kind, "ns", body)
    assert review.obj is None, case
    assert review.code == code, review.status
    status = review.status or {}
    if code == 422:
        assert status["reason"] == "Invalid"
        assert where in [c["field"] for c in status["details"]["causes"]], status["details"]
    else:
        assert status["reason"] == "BadRequest"
        assert where in status["message"], status["message"]


JOBSET_BODY: dict[str, Any] = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "metadata": {"name": "js", "namespace": "ns"},
    "spec": {
        "replicatedJobs": [
            {
                "name": "w",
                "replicas": 1,
                "template": {
                    "spec": {
                        "template": {
                            "spec": {
                                "containers": [
                                    {"name": "c", "image": "i", "resources": {"limits": {"cpu": 1}}}
                                ]
                            }
                        }
                    }
                },
            }
        ]
    },
}
CRD_REFUSED: list[tuple[str, Edit, str]] = [
    (
        "replicas a string",
        lambda b: b["spec"]["replicatedJobs"][0].update(replicas="2"),
        "spec.replicatedJobs[0].replicas",
    ),
    (
        "replicatedJob without a name",
        lambda b: b["spec"]["replicatedJobs"][0].pop("name"),
        "spec.replicatedJobs[0].name",
    ),
    (
        "a fractional quantity in a CRD's template",
        lambda b: b["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"
        ][0]["resources"]["limits"].update(cpu=0.5),
        "spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.limits[cpu]",
    ),
    (
        "a quantity string that is none",
        lambda b: b["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"
        ][0]["resources"]["limits"].update(cpu="one"),
        "spec.replicatedJobs[0].template.spec.template.spec.containers[0].resources.limits[cpu]",
    ),
    ("JobSet name not a DNS subdomain", lambda b: b["metadata"].update(name="JS"), "metadata.name"),
]


@pytest.mark.parametrize(("case", "edit", "where"), CRD_REFUSED, ids=[r[0] for r in CRD_REFUSED])
def test_a_workload_breaking_its_crd_schema_is_422_naming_the_field(
    case: str, edit: Edit, where: str
) -> None:
    review = create(JOBSET, "ns", edited(JOBSET_BODY, edit))
    assert review.code == 422, case
    assert where in [c["field"] for c in (review.status or {})["details"]["causes"]]


def test_unknown_fields_are_pruned_and_recorded_numbers_kept_in_a_crd() -> None:
    body = edited(JOBSET_BODY, lambda b: b["spec"]["replicatedJobs"][0].update(colour="red"))
    review = create(JOBSET, "ns", body)
    assert review.obj is not None
    assert review.pruned == ["spec.replicatedJobs[0].colour"]
    assert "colour" not in review.obj["spec"]["replicatedJobs"][0]
    template = review.obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    # a custom resource keeps an integer quantity as given (int-or-string)
    assert template["spec"]["containers"][0]["resources"]["limits"] == {"cpu": 1}


def test_a_pod_is_stored_defaulted_with_canonical_quantities_and_unknown_fields_dropped() -> None:
    body = edited(
        pod(),
        lambda p: c0(p)["resources"].update(
            limits={"nvidia.com/gpu": 1, "cpu": 0.5, "memory": "1.5Gi"}, colour="red"
        ),
    )
    review = create(POD, "ns", body)
    assert review.obj is not None, review.status
    assert review.pruned == ["spec.containers[0].resources.colour"]
    # numbers are quantities (Quantity.UnmarshalJSON), stored canonical; requests from limits
    want = {"nvidia.com/gpu": "1", "cpu": "500m", "memory": "1536Mi"}
    assert c0(review.obj)["resources"] == {"limits": want, "requests": want}
    spec = review.obj["spec"]
    assert (spec["restartPolicy"], spec["schedulerName"]) == ("Always", "default-scheduler")
    assert review.obj["status"] == {"phase": "Pending"}


def test_a_job_is_defaulted_and_selects_its_pods_by_uid() -> None:
    review = create(JOB, "ns", job(parallelism=2))
    assert review.obj is not None, review.status
    spec, uid = review.obj["spec"], review.obj["metadata"]["uid"]
    # parallelism given alone: completions stays unset (any one success ends the Job)
    assert "completions" not in spec
    assert (spec["parallelism"], spec["backoffLimit"]) == (2, 6)
    assert spec["completionMode"] == "NonIndexed" and spec["suspend"] is False
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = spec["template"]["metadata"]["labels"]
    assert labels["batch.kubernetes.io/job-name"] == labels["job-name"] == "j"
    assert labels["controller-uid"] == uid


GATED = pod(
    schedulingGates=[{"name": "fedbroker.io/placement"}],
    affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
)
TERM = (
    "spec",
    "affinity",
    "nodeAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
    "nodeSelectorTerms",
)


def _term(p: dict[str, Any]) -> dict[str, Any]:
    node: Any = p
    for step in TERM:
        node = node[step]
    return node[0]  # type: ignore[no-any-return]


PIN = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
# (case, stored pod, edit of it, refused field or None when allowed)
UPDATES: list[tuple[str, dict[str, Any], Edit, str | None]] = [
    (
        "labels and annotations change",
        pod(),
        lambda p: p["metadata"].update(labels={"a": "b"}, annotations={"c": "d"}),
        None,
    ),
    ("image changes", pod(), lambda p: c0(p).update(image="busybox:1"), None),
    (
        "a toleration is added",
        pod(),
        lambda p: p["spec"].update(tolerations=[{"key": "k", "operator": "Exists"}]),
        None,
    ),
    (
        "gated: the gate removed and the affinity narrowed",
        GATED,
        lambda p: (p["spec"].pop("schedulingGates"), _term(p).update(matchFields=[PIN])),
        None,
    ),
    (
        "gated: a nodeSelector added",
        GATED,
        lambda p: p["spec"].update(nodeSelector={"zone": "a"}),
        None,
    ),
    (
        "gated: a term's requirement replaced",
        GATED,
        lambda p: _term(p).update(
            matchExpressions=[{"key": "zone", "operator": "In", "values": ["b"]}]
        ),
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]",
    ),
    (
        "gated: a term added",
        GATED,
        lambda p: p["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"].append({"matchFields": [PIN]}),
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
    ),
    (
        "ungated: the affinity narrowed",
        pod(),
        lambda p: p["spec"].update(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchFields": [PIN]}]
                    }
                }
            }
        ),
        "spec",
    ),
    (
        "a gate added",
        pod(),
        lambda p: p["spec"].update(schedulingGates=[{"name": "a.io/g"}]),
        "spec.schedulingGates[0].name",
    ),
    ("nodeName set by a patch", pod(), lambda p: p["spec"].update(nodeName="n1"), "spec"),
    ("resources changed", pod(), lambda p: c0(p)["resources"]["limits"].update(cpu="2"), "spec"),
    (
        "a container added",
        pod(),
        lambda p: p["spec"]["containers"].append({"name": "b", "image": "i"}),
        "spec.containers",
    ),
    (
        "a toleration removed",
        pod(tolerations=[{"key": "k", "operator": "Exists"}]),
        lambda p: p["spec"].pop("tolerations"),
        "spec.tolerations",
    ),
    (
        "activeDeadlineSeconds raised",
        pod(activeDeadlineSeconds=10),
        lambda p: p["spec"].update(activeDeadlineSeconds=20),
        "spec.activeDeadlineSeconds",
    ),
    (
        "terminationGracePeriodSeconds changed",
        pod(),
        lambda p: p["spec"].update(terminationGracePeriodSeconds=5),
        "spec",
    ),
    ("name changed", pod(), lambda p: p["metadata"].update(name="q"), "metadata.name"),
]


@pytest.mark.parametrize(("case", "stored", "edit", "where"), UPDATES, ids=[u[0] for u in UPDATES])
def test_pod_updates_follow_validate_pod_update(
    case: str, stored: dict[str, Any], edit: Edit, where: str | None
) -> None:
    old = create(POD, "ns", stored).obj
    assert old is not None
    review = update(POD, old, edited(old, edit), None)
    if where is None:
        assert review.obj is not None, review.status
    else:
        assert review.code == 422, case
        assert where in [c["field"] for c in (review.status or {})["details"]["causes"]]


pytestmark = pytest.mark.kmock(cls=NamespacedEmulator)


async def test_a_refusal_reaches_the_client_as_the_servers_status(kmock: Any) -> None:
    k8s: NamespacedEmulator = kmock
    k8s.resources["v1/pods"] = kmocklib.ResourceInfo(namespaced=True)
    k8s.objects[NAMESPACES, None, "ns"] = {"metadata": {"name": "ns"}}
    bad = edited(pod(), lambda p: c0(p).update(name="Main"))
    async with k8s.post("/api/v1/namespaces/ns/pods", json=bad) as r:
        assert r.status == 422
        body = await r.json()
    assert body["kind"] == "Status" and body["reason"] == "Invalid"
    assert body["message"].startswith('Pod "p" is invalid: spec.containers[0].name: Invalid value')
    assert [r.fields for r in k8s.take_refusals()] == [["spec.containers[0].name"]]
    assert (PODS, "ns", "p") not in k8s.objects or k8s.objects[PODS, "ns", "p"].deleted
    async with k8s.post(
        "/api/v1/namespaces/ns/pods", json=pod(schedulingGates=[{"name": "a.io/g"}])
    ) as r:
        assert r.status == 200
    async with k8s.post(
        "/api/v1/namespaces/ns/pods/p/binding", json={"target": {"name": "n1"}}
    ) as r:
        assert r.status == 409  # a gated pod is not bound
    assert len(k8s.take_refusals()) == 1
    await k8s.patch_pod("ns", "p", {"spec": {"schedulingGates": None}})
    await k8s.patch_pod("ns", "p", {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    stored = k8s.objects[PODS, "ns", "p"].raw
    assert (stored["spec"]["nodeName"], stored["status"]["phase"]) == ("n1", "Running")
    assert k8s.unexpected() == []
