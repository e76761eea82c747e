"""The pull-mode agent's manifests (deploy/kustomize/agent), checked offline.

test_deploy renders them with every other kustomization (strict schemas, no secret value
shipped); here, what running ``fedbroker agent`` in a member needs: exactly the member RBAC
the broker's own account gets (test_deploy.check_member_rules, the one statement of what the
Kubernetes launcher and the capacity watch call), a pod the restricted Pod Security
Standard admits (the broker's own evaluation of it, broker.manifest.podsecurity), the
arguments the real CLI takes (in-cluster: no kubeconfig; MQTT over TLS with a client
certificate from a Secret the agent can read), and a launch config whose settings are a kube
source's and whose tenants are the broker's.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, cast

import pytest
import yaml
from test_deploy import (
    AGENT_TARGET,
    MEMBER_TARGET,
    Doc,
    _member_grants,
    _of_kind,
    _one,
    _parsed_config,
    check_member_rules,
    kubectl_or_skip,
    render,
)

from broker.cli.main import build_parser
from broker.config import KubeSource
from broker.manifest.podsecurity import Fields, Pod, check

Rendered = dict[str, list[Doc]]
SECRET_ENV = {"FEDBROKER_AGENT_KEY"}
TLS_FLAGS = ("--mqtt-ca-file", "--mqtt-cert-file", "--mqtt-key-file")


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    """The agent's render, and the two it is checked against."""
    kubectl = kubectl_or_skip()
    return {target: render(kubectl, target) for target in (AGENT_TARGET, MEMBER_TARGET, "base")}


def _deployment(docs: list[Doc]) -> Doc:
    return _one(docs, "Deployment")


def _container(docs: list[Doc]) -> Doc:
    [container] = _deployment(docs)["spec"]["template"]["spec"]["containers"]
    return cast(Doc, container)


def _args(docs: list[Doc]) -> dict[str, str]:
    """--flag -> value of the container's ``--flag=value`` arguments."""
    args = _container(docs)["args"]
    assert args[0] == "agent", args
    return dict(a.split("=", 1) for a in args[1:])


def _mounted_file(docs: list[Doc], path: str) -> str:
    """The text of the file at ``path`` in the container: a key of a mounted ConfigMap."""
    pod = _deployment(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    file = PurePosixPath(path)
    mounts = {m["mountPath"]: m["name"] for m in _container(docs)["volumeMounts"]}
    volume = volumes[mounts[str(file.parent)]]
    assert "configMap" in volume, f"{file.parent} is no ConfigMap mount"
    [config_map] = [m for m in _of_kind(docs, "ConfigMap")
                    if m["metadata"]["name"] == volume["configMap"]["name"]]  # fmt: skip
    return cast(str, config_map["data"][file.name])


def test_the_agent_is_granted_what_the_brokers_account_is(rendered: Rendered) -> None:
    agent = rendered[AGENT_TARGET]
    (home, account), rules, namespaced = _member_grants(agent)
    assert (home, account) == ("fedbroker", "fedbroker-agent")
    assert not namespaced, "tenant namespaces appear at run time: every grant is cluster-wide"
    check_member_rules(rules, burst=False)
    # The very roles of member-cluster (one copy: member-roles), not a lookalike.
    roles = {r["metadata"]["name"]: r["rules"] for r in _of_kind(agent, "ClusterRole")}
    theirs = {r["metadata"]["name"]: r["rules"]
              for r in _of_kind(rendered[MEMBER_TARGET], "ClusterRole")}  # fmt: skip
    assert roles == theirs
    # Its account and pod live in the namespace no tenant can be given.
    assert {d["metadata"].get("namespace") for d in agent} <= {None, home}
    config = _parsed_config(rendered["base"])
    for source in (c.source.kube for c in config.clusters if c.source.kube is not None):
        for tenant in config.tenants:
            assert source.namespace_for(tenant.name) != home


def test_the_agents_pod_is_admitted_as_restricted(rendered: Rendered) -> None:
    docs = rendered[AGENT_TARGET]
    [namespace] = _of_kind(docs, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    template = _deployment(docs)["spec"]["template"]
    fields = Fields()
    check(Pod.read(template, ("spec", "template"), fields), "restricted", fields)
    assert fields.found == []
    # Beyond the standard: nothing written but /tmp, an emptyDir.
    assert _container(docs)["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in _container(docs)["volumeMounts"]}
    assert "emptyDir" in mounts["/tmp"]
    for mount in _container(docs)["volumeMounts"]:
        assert mount.get("readOnly") is True or mount["mountPath"] == "/tmp", mount


def test_one_agent_serving_nothing(rendered: Rendered) -> None:
    docs = rendered[AGENT_TARGET]
    spec = _deployment(docs)["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}  # never two agents of one cluster
    assert not _of_kind(docs, "Service"), "no inbound port"
    assert "ports" not in _container(docs)
    assert {d["kind"] for d in docs} <= {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
        "Deployment",
    }  # fmt: skip


def test_the_agents_arguments_and_secrets(rendered: Rendered) -> None:
    docs = rendered[AGENT_TARGET]
    args = _args(docs)
    build_parser().parse_args(_container(docs)["args"])  # the real CLI takes them
    env = {e["name"]: e for e in _container(docs)["env"]}
    assert set(env) >= SECRET_ENV
    for name in SECRET_ENV:
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "fedbroker-agent", name
    # Its MQTT identity is its client certificate (the ACL's user: the CN), no password.
    assert "--mqtt-username" not in args and "FEDBROKER_MQTT_PASSWORD" not in env


def test_the_client_certificate_comes_from_a_secret_the_agent_can_read(
    rendered: Rendered,
) -> None:
    docs = rendered[AGENT_TARGET]
    args = _args(docs)
    pod = _deployment(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in _container(docs)["volumeMounts"]}
    for flag in TLS_FLAGS:
        file = PurePosixPath(args[flag])
        secret = volumes[mounts[str(file.parent)]]["secret"]
        assert secret["secretName"] == "fedbroker-agent-mqtt", flag
        # Files of a Secret volume are root's: the pod's fsGroup and the group's read bit
        # are what let the agent (a non-root user) read the key.
        assert secret["defaultMode"] & 0o040 and not secret["defaultMode"] & 0o007, flag
    assert pod["securityContext"]["fsGroup"] == _container(docs)["securityContext"]["runAsGroup"]
    assert not _of_kind(docs, "Secret"), "the certificate and its key are the operator's"


def test_the_agent_runs_as_its_pods_own_service_account(rendered: Rendered) -> None:
    """No kubeconfig: the library's in-cluster loader (the kubelet's token, followed as it
    rotates; tests/agent/test_agent_in_cluster.py)."""
    docs = rendered[AGENT_TARGET]
    pod = _deployment(docs)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == "fedbroker-agent"
    assert "--kubeconfig" not in _args(docs) and "--context" not in _args(docs)
    names = {m["metadata"]["name"] for m in _of_kind(docs, "ConfigMap")}
    assert all(name.startswith("fedbroker-agent-launch") for name in names), names


def test_the_launch_config_is_a_kube_source_and_the_brokers_tenants(
    rendered: Rendered,
) -> None:
    docs = rendered[AGENT_TARGET]
    launch: dict[str, Any] = yaml.safe_load(_mounted_file(docs, _args(docs)["--launch-config"]))
    tenants = launch.pop("tenants")
    # The broker's own kube source takes the same settings (a stand-in kubeconfig: the
    # agent has its own), strictly: a misspelt key fails here.
    source = KubeSource.model_validate({**launch, "kubeconfig": "k", "context": "c"})
    assert source.launch_mode == launch["launchMode"]
    config = _parsed_config(rendered["base"])
    brokers = {t.name: (t.pod_security, t.service_accounts) for t in config.tenants}
    assert {t["name"]: (t["podSecurity"], t["serviceAccounts"]) for t in tenants} == brokers
    for tenant in brokers:
        assert source.namespace_problem(tenant) is None
