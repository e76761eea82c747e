"""The pull-mode agent's manifests (deploy/kustomize/agent), checked offline.

test_deploy renders them with every other kustomization (strict schemas, no secret value
shipped); here, what running ``fedbroker agent`` in a member needs: exactly the member RBAC
the broker's own account gets (test_deploy.check_member_rules, the one statement of what the
Kubernetes launcher and the capacity watch call), a pod the restricted Pod Security
Standard admits (the broker's own evaluation of it, broker.manifest.podsecurity), the
arguments the real CLI takes, the shipped in-cluster kubeconfig loaded by the real loader,
and a launch config whose settings are a kube source's and whose tenants are the broker's.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, cast

import pytest
import yaml
from pki import Authority
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

from adapters.kubeapi.kubeconfig import load_clients
from broker.cli.main import build_parser
from broker.config import KubeSource
from broker.manifest.podsecurity import Fields, Pod, check

Rendered = dict[str, list[Doc]]
SERVICE_ACCOUNT_DIR = PurePosixPath("/var/run/secrets/kubernetes.io/serviceaccount")
SECRET_ENV = {"FEDBROKER_MQTT_PASSWORD", "FEDBROKER_AGENT_KEY"}


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
    assert args["--mqtt-username"] == args["--cluster"], "the ACL grants by username"
    build_parser().parse_args(_container(docs)["args"])  # the real CLI takes them
    env = {e["name"]: e for e in _container(docs)["env"]}
    for name in SECRET_ENV:
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "fedbroker-agent", name


async def test_the_shipped_kubeconfig_is_the_pods_own_account(
    rendered: Rendered, tmp_path: Path
) -> None:
    """The real loader reads it; with the kubelet's files in place it talks to the API
    server's Service as the pod's account."""
    docs = rendered[AGENT_TARGET]
    assert _deployment(docs)["spec"]["template"]["spec"]["automountServiceAccountToken"]
    doc = yaml.safe_load(_mounted_file(docs, _args(docs)["--kubeconfig"]))
    [user] = doc["users"]
    [cluster] = doc["clusters"]
    assert user["user"] == {"tokenFile": str(SERVICE_ACCOUNT_DIR / "token")}
    assert cluster["cluster"]["certificate-authority"] == str(SERVICE_ACCOUNT_DIR / "ca.crt")
    # Where the kubelet would have put them, here:
    (tmp_path / "token").write_text("stand-in-token")
    user["user"]["tokenFile"] = str(tmp_path / "token")
    cluster["cluster"]["certificate-authority"] = str(Authority(tmp_path).ca_file)
    clients, _ = await load_clients(doc, [doc["current-context"]])
    [client] = clients.values()
    try:
        assert client.configuration.host == "https://kubernetes.default.svc"
        assert list(client.configuration.api_key.values()) == ["Bearer stand-in-token"]
    finally:
        await client.close()  # type: ignore[no-untyped-call]


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
