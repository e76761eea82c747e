"""leaderworkerset.x-k8s.io/v1 LeaderWorkerSet: ``spec.replicas`` groups (default 1) of
``spec.leaderWorkerTemplate.size`` pods (default 1) each, a leader and ``size - 1``
workers. Pod sets as Kueue's integration derives them for one group
(``pkg/controller/jobs/leaderworkerset``), times the groups: with a ``leaderTemplate``,
``leader`` (one pod a group, ``leaderWorkerTemplate.leaderTemplate``) and ``worker``
(``size - 1`` a group, ``workerTemplate``; none when ``size`` is 1); without one, every pod
comes from ``workerTemplate``: one pod set ``main`` of ``size`` a group. Kueue admits each
group as its own workload; the broker places every group of the object as one gang, on one
cluster (a group's pods start together, and so do the groups).

How LWS makes its pods (kubernetes-sigs/lws, ``pkg/controllers``, ``pkg/webhooks``): a
leader StatefulSet ``<name>`` makes the leaders ``<name>-<group>``; once a leader pod exists
(``startupPolicy: LeaderCreated``) a worker StatefulSet ``<name>-<group>`` (ordinals from
1) makes its workers ``<name>-<group>-<worker>``. Every pod is labelled
``leaderworkerset.sigs.k8s.io/name``, ``group-index`` and ``worker-index`` (0: the leader;
its pod webhook writes the indexes from the pod's ordinal) and annotated with the group's
``size``; the webhook adds env (``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``,
``LWS_WORKER_INDEX``), no container, so ``INJECTIONS`` is empty. A pod's index in its pod
set (``pod_index``): a leader's is its group, a worker's ``group * (size - 1) + worker -
1``, a ``main`` pod's ``group * size + worker``.

It serves until cancelled: ``end`` never answers. What the broker cannot honour is refused
in ``FIELDS``: ``startupPolicy: LeaderReady`` (a group's workers made only once its leader
is Ready: a gang scheduler holding the leader until its workers exist never starts it), a
rollout's tuning (the broker never updates a running workload, so there is no rollout; a
surge would make groups beyond the placement), sub-groups (they exist for exclusive
topology placement, which the broker does instead) and volume claim templates. Scaling:
``replicas`` is fixed at admission; a group made beyond it (an autoscaler in the member)
is pods beyond the placement, which stay gated in pin mode. The object's annotations
``leaderworkerset.sigs.k8s.io/exclusive-topology`` and ``subgroup-exclusive-topology`` (each
group alone in a topology domain, by pod affinity) are refused: the broker's placement does
not read them, and two groups it placed in one domain would never schedule.

``rules``: the names LWS makes: its headless Service is named after the object (a
DNS-1035 label); a StatefulSet's pods carry ``controller-revision-hash: <set>-<hash>`` (up
to 10 characters more), a label value of at most 63, so the last group's StatefulSet name
may be at most 52; the last pod's name is a DNS-1123 label (its hostname)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.manifest.apirules import DNS1035_LABEL, DNS1123_LABEL, name_problem
from broker.manifest.podrequests import Violation
from broker.manifest.workloads.allowlist import TEMPLATE, Table, one_of, refused, whole
from broker.manifest.workloads.injection import Injection
from broker.manifest.workloads.integration import Integration
from broker.manifest.workloads.reading import (
    DerivedPodSet,
    bounded,
    count,
    mapping,
    pod_template,
)
from broker.manifest.workloads.status import label_index
from broker.ports import RunEnd

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
LEADER, WORKER, MAIN = "leader", "worker", "main"
LATE_POD_SETS: frozenset[str] = frozenset()
INJECTIONS: tuple[Injection, ...] = ()  # no container added (see above)
GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# A StatefulSet's controller-revision-hash label is its name, "-" and a hash of up to 10.
_REVISION_SUFFIX = 11

_LWT = "leaderWorkerTemplate"
NO_ROLLOUT = "the broker never updates a running workload: there is no rollout to tune"
CLAIMS = "makes PersistentVolumeClaims the broker neither counts nor deletes"
_EXCLUSIVE = (
    "each group alone in a topology domain: the broker's placement does not read it, and "
    "groups it placed in one domain would never schedule"
)
REFUSED_ANNOTATIONS = {
    "leaderworkerset.sigs.k8s.io/exclusive-topology": _EXCLUSIVE,
    "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology": _EXCLUSIVE,
}
FIELDS: Table = (
    ("replicas", whole(1, why="groups, counted; all placed on one cluster")),
    (
        "startupPolicy",
        one_of(
            "LeaderCreated",
            why="LeaderReady makes a group's workers only once its leader is Ready, while a "
            "gang scheduler holds the leader until its workers exist",
        ),
    ),
    (f"{_LWT}.size", whole(1, why="pods a group, counted")),
    (f"{_LWT}.leaderTemplate", TEMPLATE),
    (f"{_LWT}.workerTemplate", TEMPLATE),
    (
        f"{_LWT}.restartPolicy",
        one_of("Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"),
    ),
    (
        f"{_LWT}.subGroupPolicy",
        refused("sub-groups exist for exclusive topology placement; the broker places every pod"),
    ),
    (f"{_LWT}.volumeClaimTemplates", refused(CLAIMS)),
    (f"{_LWT}.persistentVolumeClaimRetentionPolicy", refused(CLAIMS)),
    ("networkConfig.subdomainPolicy", one_of("Shared", "UniquePerReplica")),
    ("rolloutStrategy.type", one_of("RollingUpdate")),
    (
        "rolloutStrategy.rollingUpdateConfiguration.maxSurge",
        refused(f"{NO_ROLLOUT}; a surge makes groups beyond the placement"),
    ),
    ("rolloutStrategy.rollingUpdateConfiguration.maxUnavailable", refused(NO_ROLLOUT)),
    ("rolloutStrategy.rollingUpdateConfiguration.partition", refused(NO_ROLLOUT)),
)


def pod_sets(spec: Mapping[str, Any]) -> list[DerivedPodSet]:
    at = ("spec",)
    groups = count(spec, "replicas", at, default=1, least=1)
    lwt = mapping(spec, _LWT, at)
    where = (*at, _LWT)
    size = count(lwt, "size", where, default=1, least=1)
    workers, workers_path = pod_template(lwt, "workerTemplate", where)
    if lwt.get("leaderTemplate") is None:
        return [bounded(DerivedPodSet(MAIN, groups * size, workers, workers_path), where)]
    leader, leader_path = pod_template(lwt, "leaderTemplate", where)
    out = [bounded(DerivedPodSet(LEADER, groups, leader, leader_path), where)]
    if size > 1:
        out.append(bounded(DerivedPodSet(WORKER, groups * (size - 1), workers, workers_path),
                           where))  # fmt: skip
    return out


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def rules(name: str, spec: Mapping[str, Any]) -> list[Violation]:
    at = ("metadata", "name")
    problem = name_problem(name, DNS1035_LABEL, 63, "a DNS-1035 label (a letter first)")
    if problem is not None:
        return [Violation(at, f"a LeaderWorkerSet's name names its Service: {problem}")]
    lwt = spec.get(_LWT)
    size = _int(lwt.get("size") if isinstance(lwt, Mapping) else None, 1)
    last_group = max(_int(spec.get("replicas"), 1) - 1, 0)
    last_set = f"{name}-{last_group}" if size > 1 else name
    most = 63 - _REVISION_SUFFIX
    if len(last_set) > most:
        return [Violation(at, f"LWS names a StatefulSet {last_set!r}, longer than {most} "
                          "characters: its pods' controller-revision-hash label would be "
                          "longer than 63")]  # fmt: skip
    last_pod = f"{name}-{last_group}-{size - 1}" if size > 1 else f"{name}-{last_group}"
    problem = name_problem(last_pod, DNS1123_LABEL, 63, "a DNS-1123 label")
    if problem is not None:
        return [Violation(at, f"LWS names its last pod {last_pod!r}: {problem}")]
    return []


# -- the runtime half: how LWS's pods and status read -------------------------------------


def pod_index(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    """The pod's index in its pod set, from its group and worker indexes and the object's
    ``size`` (see the module's docstring); None without them."""
    g, w = label_index(pod, GROUP_LABEL), label_index(pod, WORKER_LABEL)
    if g is None or w is None:
        return None
    lwt = (workload.get("spec") or {}).get(_LWT) or {}
    size = _int(lwt.get("size"), 1)
    if lwt.get("leaderTemplate") is None:
        return g * size + w
    return g if w == 0 else g * (size - 1) + w - 1


def end(obj: Mapping[str, Any]) -> RunEnd | None:
    """Never: a LeaderWorkerSet serves until it is cancelled."""
    return None


INTEGRATION = Integration(
    GROUP, VERSION, KIND, PLURAL, pod_sets, FIELDS, INJECTIONS, rules=rules,
    index=pod_index, ending=end, refused_annotations=REFUSED_ANNOTATIONS,
    pod_sets_doc="`leader` and `worker` (with a `leaderTemplate`), else `main`; each group "
    "a gang, all on one cluster",
    count_doc="`replicas` groups (default 1) x `leaderWorkerTemplate.size` pods (1 leader, "
    "size-1 workers)",
)  # fmt: skip
