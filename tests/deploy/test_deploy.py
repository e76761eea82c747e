"""The Kubernetes manifests an operator applies (deploy/kustomize), checked offline.

Every kustomization (the base, overlays sqlite and postgres, the member-cluster RBAC, the
pull-mode agent) is rendered with ``kubectl kustomize`` (Debian package kubectl, kustomize
built in). Built-in kinds are validated against the Kubernetes OpenAPI schemas that
kubernetes-validate ships (strict: unknown fields are errors); the Prometheus Operator kinds
are checked by hand. Then
what the broker needs: the pod's security context, probes, replicas, that no secret value is
shipped, that the shipped config parses (broker.config.parse_config) with tokens from the
env the Deployment provides, and that the RBAC grants what the adapters call.

Without kubectl the rendering tests skip with the reason, or fail under
FEDBROKER_REQUIRE_SERVICES=1. The PrometheusRule freshness check needs no tool.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, cast

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from broker.config import Config, parse_config
from broker.manifest.workloads import INTEGRATIONS

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
GENERATOR = ROOT / "deploy" / "prometheusrule.py"
PROMETHEUS_RULE = KUSTOMIZE / "base" / "prometheusrule.yaml"

KUBERNETES_VERSION = "1.30"  # the oldest minor still supported upstream when this was written
NAMESPACE = "fedbroker"
BROKER_TARGETS = ("base", "overlays/sqlite", "overlays/postgres")
MEMBER_TARGET = "member-cluster"
BURST_MEMBER_TARGET = "member-cluster-burst"  # member-cluster plus nodes patch
MEMBER_TARGETS = (MEMBER_TARGET, BURST_MEMBER_TARGET)
AGENT_TARGET = "agent"  # pull mode: the agent in a member (test_agent_deploy checks it)
TARGETS = (*BROKER_TARGETS, *MEMBER_TARGETS, AGENT_TARGET)
REPLICAS = {"base": 2, "overlays/postgres": 2, "overlays/sqlite": 1}

MONITORING = "monitoring.coreos.com/v1"
# The Prometheus Operator fields we use (a subset of its CRDs' schemas).
SERVICE_MONITOR_SPEC = frozenset({"jobLabel", "selector", "namespaceSelector", "endpoints"})
SERVICE_MONITOR_ENDPOINT = frozenset({"port", "path", "scheme", "interval", "scrapeTimeout"})
RULE_KEYS = frozenset({"alert", "expr", "for", "labels", "annotations"})

Doc = dict[str, Any]


# --- rendering ----------------------------------------------------------------------------


def kubectl_or_skip() -> str:
    """kubectl's path; skips (or fails under FEDBROKER_REQUIRE_SERVICES=1) without it."""
    path = shutil.which("kubectl")
    if path is None:
        reason = "kubectl not found on PATH (install the Debian package kubectl)"
        if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (FEDBROKER_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    return path


def render(kubectl: str, target: str) -> list[Doc]:
    """The objects ``kubectl kustomize deploy/kustomize/<target>`` renders."""
    result = subprocess.run(
        [kubectl, "kustomize", str(KUSTOMIZE / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {target}: {result.stderr}"
    docs = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    assert docs, f"{target} renders nothing"
    assert all(isinstance(d, dict) for d in docs), target
    return cast(list[Doc], docs)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    """target -> the objects ``kubectl kustomize deploy/kustomize/<target>`` renders."""
    kubectl = kubectl_or_skip()
    return {target: render(kubectl, target) for target in TARGETS}


def _of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[Doc], kind: str) -> Doc:
    found = _of_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects, expected one"
    return found[0]


def _pod_spec(docs: list[Doc]) -> Doc:
    return cast(Doc, _one(docs, "Deployment")["spec"]["template"]["spec"])


def _container(docs: list[Doc]) -> Doc:
    containers = _pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["fedbroker"]
    return cast(Doc, containers[0])


def _mounts(docs: list[Doc]) -> dict[str, Doc]:
    """mountPath -> the volume mounted there."""
    volumes = {v["name"]: v for v in _pod_spec(docs)["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in _container(docs)["volumeMounts"]}


def stand_in(env: str) -> str:
    """A distinct stand-in token for an env variable, long enough for the config (32+)."""
    return f"stand-in-{env.lower()}-0123456789abcdef"


def _secret_env(docs: list[Doc]) -> dict[str, tuple[str, str]]:
    """env name -> (Secret, key) for every variable the container takes from a Secret."""
    refs: dict[str, tuple[str, str]] = {}
    for var in _container(docs).get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            refs[var["name"]] = (ref["name"], ref["key"])
    return refs


def _shipped_config(docs: list[Doc]) -> tuple[str, str]:
    """(the --config path, the text of that file in the ConfigMap mounted for it)."""
    args = _container(docs)["args"]
    assert args[:2] == ["serve", "--config"], args
    path = PurePosixPath(args[2])
    volume = _mounts(docs).get(str(path.parent))
    assert volume is not None and "configMap" in volume, f"{path.parent} is no ConfigMap mount"
    name = volume["configMap"]["name"]
    maps = [m for m in _of_kind(docs, "ConfigMap") if m["metadata"]["name"] == name]
    assert len(maps) == 1, f"ConfigMap {name} not rendered"
    return str(path), maps[0]["data"][path.name]


def _parsed_config(docs: list[Doc]) -> Config:
    """The shipped config, parsed with the env the Deployment takes from Secrets (each
    variable a distinct stand-in value): a token env the Deployment lacks fails here."""
    path, text = _shipped_config(docs)
    environ = {name: stand_in(name) for name in _secret_env(docs)}
    return parse_config(text, path, environ)


# --- the PrometheusRule: generated from alerts.yaml -----------------------------------------


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("deploy_prometheusrule", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_prometheusrule_is_what_the_generator_writes() -> None:
    wanted = _generator().render(ALERTS.read_text(encoding="utf-8"))
    assert PROMETHEUS_RULE.read_text(encoding="utf-8") == wanted, (
        f"{PROMETHEUS_RULE.relative_to(ROOT)} is stale: run python deploy/prometheusrule.py"
    )


def test_generator_check_mode_tells_stale_from_fresh(tmp_path: Path) -> None:
    module = _generator()
    assert module.main(["--check"]) == 0
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text("# edited by hand\n", encoding="utf-8")
    module.OUTPUT = stale
    assert module.main(["--check"]) == 1
    assert stale.read_text(encoding="utf-8") == "# edited by hand\n"  # --check writes nothing
    assert module.main([]) == 0
    assert stale.read_text(encoding="utf-8") == PROMETHEUS_RULE.read_text(encoding="utf-8")


# --- schemas -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_builtin_kinds_validate_strictly(rendered: dict[str, list[Doc]], target: str) -> None:
    builtin = [d for d in rendered[target] if d["apiVersion"] != MONITORING]
    assert builtin
    for doc in builtin:
        what = f"{target}: {doc['kind']} {doc['metadata'].get('name')}"
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{what}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{what}: not a built-in kind, no hand check either: {exc.message}")


def test_the_validator_rejects_unknown_fields(rendered: dict[str, list[Doc]]) -> None:
    """The strict schemas do catch a typo (so the test above can fail)."""
    deployment = _one(rendered["base"], "Deployment")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_only_known_custom_kinds(rendered: dict[str, list[Doc]], target: str) -> None:
    custom = sorted(d["kind"] for d in rendered[target] if d["apiVersion"] == MONITORING)
    expected = [] if target not in BROKER_TARGETS else ["PrometheusRule", "ServiceMonitor"]
    assert custom == expected


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_service_monitor_scrapes_metrics_as_job_fedbroker(
    rendered: dict[str, list[Doc]], target: str
) -> None:
    docs = rendered[target]
    monitor = _one(docs, "ServiceMonitor")
    service = _one(docs, "Service")
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert monitor["metadata"]["namespace"] == NAMESPACE
    spec = monitor["spec"]
    assert set(spec) <= SERVICE_MONITOR_SPEC, set(spec) - SERVICE_MONITOR_SPEC
    # The alerts expect up{job="fedbroker"}: the job is the Service's jobLabel label.
    assert service["metadata"]["labels"][spec["jobLabel"]] == "fedbroker"
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT, set(endpoint) - SERVICE_MONITOR_ENDPOINT
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in port_names


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_prometheus_rule_carries_the_groups_of_alerts_yaml(
    rendered: dict[str, list[Doc]], target: str
) -> None:
    rule = _one(rendered[target], "PrometheusRule")
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert set(rule["spec"]) == {"groups"}
    alerts = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == alerts["groups"]
    for group in rule["spec"]["groups"]:
        assert set(group) == {"name", "rules"}
        for alert in group["rules"]:
            assert set(alert) <= RULE_KEYS, (alert.get("alert"), set(alert) - RULE_KEYS)


# --- the broker's pod ----------------------------------------------------------------------


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_replicas(rendered: dict[str, list[Doc]], target: str) -> None:
    deployment = _one(rendered[target], "Deployment")
    assert deployment["spec"]["replicas"] == REPLICAS[target]
    if target == "overlays/sqlite":  # never two pods on one SQLite file, not even in a rollout
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_pod_is_locked_down(rendered: dict[str, list[Doc]], target: str) -> None:
    pod = _pod_spec(rendered[target])["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] > 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(rendered[target])["securityContext"]
    assert container["runAsNonRoot"] is True
    assert container["runAsUser"] > 0
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container.get("privileged", False) is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_resources_and_probes(rendered: dict[str, list[Doc]], target: str) -> None:
    container = _container(rendered[target])
    for bound in ("requests", "limits"):
        assert set(container["resources"][bound]) == {"cpu", "memory"}, bound
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080}
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports.get(get["port"], get["port"]) == 8080, probe
    service = _one(rendered[target], "Service")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8080, "http")]


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_writable_paths_are_volumes(rendered: dict[str, list[Doc]], target: str) -> None:
    """The root filesystem is read-only: /tmp and the SQLite directory are volumes."""
    mounts = _mounts(rendered[target])
    assert "emptyDir" in mounts["/tmp"]
    config = _parsed_config(rendered[target])
    if config.store.sqlite_path is not None:
        directory = str(PurePosixPath(config.store.sqlite_path).parent)
        assert directory in mounts, f"the SQLite directory {directory} is not a volume"
        assert "persistentVolumeClaim" in mounts[directory]  # survives a restart
        claim = mounts[directory]["persistentVolumeClaim"]["claimName"]
        claims = {
            c["metadata"]["name"] for c in _of_kind(rendered[target], "PersistentVolumeClaim")
        }
        assert claim in claims


# --- secrets: referenced, never shipped ------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_no_secret_value_is_shipped(rendered: dict[str, list[Doc]], target: str) -> None:
    for secret in _of_kind(rendered[target], "Secret"):
        # Only a service-account token Secret, which the cluster fills in.
        assert secret["type"] == "kubernetes.io/service-account-token", secret["metadata"]
        assert not secret.get("data") and not secret.get("stringData"), secret["metadata"]
    for deployment in _of_kind(rendered[target], "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for var in container.get("env", []):
                if any(word in var["name"] for word in ("TOKEN", "PASSWORD", "SECRET", "KEY")):
                    assert "value" not in var, f"{var['name']} is written in the manifest"


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_secrets_referenced(rendered: dict[str, list[Doc]], target: str) -> None:
    """The kubeconfig Secret is mounted (where the config looks), the tokens come from a
    Secret, and a PostgreSQL password from a Secret too, not from the ConfigMap."""
    docs = rendered[target]
    mounts = _mounts(docs)
    config = _parsed_config(docs)
    sources = [c.source.kube for c in config.clusters] + [p.source.capi for p in config.burst_pools]
    paths = {ref.kubeconfig for ref in sources if ref is not None}
    assert paths, "no kubeconfig in the shipped config"
    for path in paths:
        assert path is not None
        volume = mounts.get(str(PurePosixPath(path).parent))
        assert volume is not None and volume["secret"]["secretName"] == "fedbroker-kubeconfig"
    secret_env = _secret_env(docs)
    for tenant in config.tenants:
        assert tenant.token is not None and tenant.token.env in secret_env, tenant.name
        assert secret_env[tenant.token.env][0] == "fedbroker-tokens"
    if config.store.is_sqlite:
        assert "PGPASSWORD" not in secret_env
    else:
        assert config.store.redacted_url == config.store.url, "a password in the store URL"
        assert secret_env["PGPASSWORD"] == ("fedbroker-postgres", "password")


# --- the shipped config ------------------------------------------------------------------------


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_shipped_config_parses(rendered: dict[str, list[Doc]], target: str) -> None:
    config = _parsed_config(rendered[target])
    assert config.api.host == "0.0.0.0"
    assert config.api.port == 8080
    assert config.clusters and config.tenants
    # Every tenant's token is the stand-in the Deployment's env gave it.
    for tenant in config.tenants:
        assert tenant.token is not None
        assert config.authenticate(stand_in(str(tenant.token.env))) is tenant
    expected = "sqlite://" if target == "overlays/sqlite" else "postgresql://"
    assert config.store.url.startswith(expected)


def test_shipped_config_needs_the_token_env() -> None:
    """parse_config does refuse the shipped config without the token variables."""
    text = (KUSTOMIZE / "base" / "federation.yaml").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="FEDBROKER_TOKEN_TEAM_A is not set"):
        parse_config(text, "federation.yaml", {})


def test_sqlite_config_differs_from_the_base_in_store_only() -> None:
    def without_store(path: Path) -> Doc:
        data = cast(Doc, yaml.safe_load(path.read_text(encoding="utf-8")))
        data.pop("store")
        return data

    base = without_store(KUSTOMIZE / "base" / "federation.yaml")
    assert base == without_store(KUSTOMIZE / "overlays" / "sqlite" / "federation.yaml")


# --- RBAC ----------------------------------------------------------------------------------


def _allows(rules: list[Doc], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for rule in rules
    )


def _grants(docs: list[Doc], subject: tuple[str, str]) -> Iterator[tuple[str | None, list[Doc]]]:
    """(namespace, rules) per binding of the ServiceAccount ``subject`` (namespace, name);
    namespace None for a ClusterRoleBinding."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d["rules"]
             for d in docs if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = {(s["namespace"], s["name"]) for s in binding["subjects"]
                    if s["kind"] == "ServiceAccount"}  # fmt: skip
        if subject not in subjects:
            continue
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role_ns = namespace if ref["kind"] == "Role" else None
        key = (ref["kind"], role_ns, ref["name"])
        assert key in roles, f"{binding['metadata']['name']}: no {key}"
        yield (namespace if binding["kind"] == "RoleBinding" else None), roles[key]


def _member_grants(docs: list[Doc]) -> tuple[tuple[str, str], list[Doc], list[str | None]]:
    """The member ServiceAccount (namespace, name), its cluster-wide rules, and the
    namespaces of its namespaced grants (None for none)."""
    account = _one(docs, "ServiceAccount")["metadata"]
    subject = (account["namespace"], account["name"])
    grants = list(_grants(docs, subject))
    cluster_rules = [r for ns, rules in grants if ns is None for r in rules]
    return subject, cluster_rules, [ns for ns, _ in grants if ns is not None]


@pytest.mark.parametrize("target", MEMBER_TARGETS)
def test_member_cluster_rbac_covers_what_the_broker_calls(
    rendered: dict[str, list[Doc]], target: str
) -> None:
    member = rendered[target]
    _, rules, namespaced = _member_grants(member)
    assert not namespaced, "tenant namespaces appear at run time: every grant is cluster-wide"
    check_member_rules(rules, burst=target == BURST_MEMBER_TARGET)


def check_member_rules(rules: list[Doc], *, burst: bool) -> None:
    """``rules`` grant what a member's Kubernetes launcher and capacity watch call, and
    nothing they do not: the one statement of it, for the broker's account in a kube member
    and the agent's in an agent-fed one (test_agent_deploy). ``burst``: nodes patch too."""
    # Capacity: list+watch of nodes and pods everywhere.
    for resource, verbs in (("nodes", "get list watch"), ("pods", "get list watch")):
        for verb in verbs.split():
            assert _allows(rules, "", resource, verb), (resource, verb)
    # Tenant namespaces: read, created with their Pod Security labels, relabelled.
    for verb in ("get", "create", "patch"):
        assert _allows(rules, "", "namespaces", verb), verb
    for verb in ("delete", "update", "list"):
        assert not _allows(rules, "", "namespaces", verb), f"namespaces {verb} is not needed"
    # Launch: pods and PodGroups in any tenant namespace, listed across them.
    for verb in ("create", "get", "list", "delete"):
        assert _allows(rules, "", "pods", verb), verb
        # The podSets jobs' headless rendezvous Services (issue 14).
        assert _allows(rules, "", "services", verb), ("services", verb)
    for group in ("scheduling.x-k8s.io", "scheduling.volcano.sh"):
        for verb in ("create", "get", "list", "patch", "delete"):
            assert _allows(rules, group, "podgroups", verb), (group, verb)
    # A placed job's logs (issue 14, item 3).
    assert _allows(rules, "", "pods/log", "get")
    # Workload jobs (issue 14): every kind the launcher creates, follows, deletes and
    # garbage-collects; pin mode patches its controller's pods and records Events on them.
    for kind in INTEGRATIONS:
        for verb in ("create", "get", "list", "watch", "delete"):
            assert _allows(rules, kind.group, kind.plural, verb), (kind.kind, verb)
        for read in kind.reads:
            group, plural = read.group, read.plural
            for verb in ("get", "list", "watch"):
                assert _allows(rules, group, plural, verb), (kind.kind, plural, verb)
    assert _allows(rules, "", "pods", "patch")
    assert _allows(rules, "", "events", "create")
    # Nodes are patched (labelled, cordoned) only for burst pools.
    assert _allows(rules, "", "nodes", "patch") == burst
    # Never: secrets, role bindings, pods/exec (nothing the launcher calls).
    for group, resource in (("", "secrets"), ("rbac.authorization.k8s.io", "rolebindings"),
                            ("", "pods/exec"), ("", "serviceaccounts")):  # fmt: skip
        for verb in ("get", "list", "create", "patch", "update"):
            assert not _allows(rules, group, resource, verb), (resource, verb)


@pytest.mark.parametrize("target", MEMBER_TARGETS)
def test_the_brokers_member_credentials_live_in_no_tenant_namespace(
    rendered: dict[str, list[Doc]], target: str
) -> None:
    member = rendered[target]
    (home, account), _, _ = _member_grants(member)
    [namespace] = _of_kind(member, "Namespace")
    assert namespace["metadata"]["name"] == home  # only the broker's own namespace
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    [secret] = _of_kind(member, "Secret")
    assert secret["metadata"]["namespace"] == home
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == account
    assert all(d["metadata"].get("namespace") in (None, home) for d in member)
    # No tenant of the shipped configs gets the broker's namespace, nor the old shared one
    # (fedbroker-jobs), where earlier releases kept this Secret.
    for broker_target in BROKER_TARGETS:
        config = _parsed_config(rendered[broker_target])
        sources = [c.source.kube for c in config.clusters if c.source.kube is not None]
        assert sources
        for source in sources:
            for tenant in config.tenants:
                assert source.namespace_for(tenant.name) not in (home, "fedbroker-jobs")
                assert source.namespace_problem(tenant.name) is None


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_management_rbac_scales_machine_deployments(
    rendered: dict[str, list[Doc]], target: str
) -> None:
    docs = rendered[target]
    deployment = _one(docs, "Deployment")
    subject = (deployment["metadata"]["namespace"], _pod_spec(docs)["serviceAccountName"])
    account = _one(docs, "ServiceAccount")["metadata"]
    assert (account["namespace"], account["name"]) == subject
    grants = list(_grants(docs, subject))
    config = _parsed_config(docs)
    pools = [p.source.capi for p in config.burst_pools if p.source.capi is not None]
    assert pools
    for pool in pools:
        rules = [r for ns, rules in grants if ns in (pool.namespace, None) for r in rules]
        group = "cluster.x-k8s.io"
        plural = {"MachineDeployment": "machinedeployments", "MachinePool": "machinepools"}
        assert _allows(rules, group, plural[pool.kind], "get")
        for verb in ("get", "update"):
            assert _allows(rules, group, f"{plural[pool.kind]}/scale", verb), verb
        for verb in ("get", "list", "patch"):
            assert _allows(rules, group, "machines", verb), verb
    assert not any(ns is None for ns, _ in grants), "no cluster-wide grant in the management"


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_everything_lives_in_the_fedbroker_namespace(
    rendered: dict[str, list[Doc]], target: str
) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    config = _parsed_config(rendered[target])
    capi_namespaces = {p.source.capi.namespace for p in config.burst_pools if p.source.capi}
    for doc in rendered[target]:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert namespace is None, doc["metadata"]
        elif doc["kind"] == "RoleBinding" and namespace in capi_namespaces:
            continue  # the grant on the pools' namespace
        else:
            assert namespace == NAMESPACE, (doc["kind"], doc["metadata"])


@pytest.mark.parametrize("target", BROKER_TARGETS)
def test_dockerfile_matches_the_deployment(rendered: dict[str, list[Doc]], target: str) -> None:
    """The image (Dockerfile at the top; no Docker engine here, so it is read, not built)
    runs what the Deployment expects: its user is the pod's runAsUser/runAsGroup, its
    EXPOSE is the containerPort (and the shipped config's api.port), ENTRYPOINT is the
    `fedbroker` console script and CMD exactly the Deployment's args (the Deployment sets no
    `command`, so ENTRYPOINT stays and its args replace CMD); its working directory and
    data directory are volumes, as the read-only root filesystem needs."""
    import json
    import re
    import tomllib

    def instructions(text: str) -> list[tuple[str, str]]:
        """(KEYWORD, arguments) per instruction: comments dropped, continuations joined."""
        out: list[tuple[str, str]] = []
        pending = ""
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            keyword, _, rest = (pending + line).partition(" ")
            out.append((keyword.upper(), rest.strip()))
            pending = ""
        assert not pending, "the Dockerfile ends in a line continuation"
        return out

    steps = instructions((ROOT / "Dockerfile").read_text())
    froms = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    assert len(froms) >= 2, "a multi-stage build: dependencies built apart from the runtime"
    final = steps[froms[-1] :]  # what the image that runs is made of

    def last(keyword: str) -> str:
        found = [rest for k, rest in final if k == keyword]
        assert found, f"the runtime stage has no {keyword}"
        return found[-1]

    def exec_form(keyword: str) -> list[str]:
        value = json.loads(last(keyword))
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), keyword
        return value

    docs = rendered[target]
    pod = _pod_spec(docs)["securityContext"]
    container = _container(docs)
    # The user: numeric (runAsNonRoot can check it), the Deployment's uid and gid.
    user, _, group = last("USER").partition(":")
    assert user == str(pod["runAsUser"]) == str(container["securityContext"]["runAsUser"])
    assert group == str(pod["runAsGroup"]) == str(container["securityContext"]["runAsGroup"])
    # The port.
    exposed = {int(p.split("/")[0]) for k, rest in final if k == "EXPOSE" for p in rest.split()}
    container_ports = {p["containerPort"] for p in container["ports"]}
    assert exposed == container_ports == {_parsed_config(docs).api.port}
    health = re.search(r"https?://127\.0\.0\.1:(\d+)(/\S*?)['\"]", last("HEALTHCHECK"))
    assert health is not None, "HEALTHCHECK probes no local URL"
    assert int(health.group(1)) in container_ports
    assert health.group(2) == container["livenessProbe"]["httpGet"]["path"]
    # The command: ENTRYPOINT is the console script; the Deployment's args replace CMD.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "command" not in container, "a command would replace the image's ENTRYPOINT"
    entrypoint = exec_form("ENTRYPOINT")
    assert len(entrypoint) == 1 and PurePosixPath(entrypoint[0]).name == "fedbroker"
    assert scripts["fedbroker"] == "broker.cli.main:main"
    venv = str(PurePosixPath(entrypoint[0]).parent.parent)
    copies = [rest for k, rest in final if k == "COPY" and rest.startswith("--from=")]
    assert any(rest.split()[1:] == [venv, venv] for rest in copies), f"{venv} not copied"
    assert exec_form("CMD") == container["args"]
    assert container["args"][0] == "serve"
    # Runtime dependencies only: the project without its test extras.
    installs = [rest for k, rest in steps if k == "RUN" and "pip install" in rest]
    assert installs and not any("[" in rest or " -e " in rest for rest in installs), installs
    # Read-only root filesystem: no bytecode writes, temp files in /tmp, cwd on a volume.
    env = " ".join(rest for k, rest in final if k == "ENV")
    assert re.search(r"\bPYTHONDONTWRITEBYTECODE=1\b", env)
    assert re.search(r"\bTMPDIR=/tmp\b", env)
    mounts = _mounts(docs)
    assert "/tmp" in mounts and "emptyDir" in mounts["/tmp"]
    assert last("WORKDIR") in mounts, "the working directory is not a volume"
    # Only the sources go into the build context.
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ignored[0] == "*", ".dockerignore starts by excluding everything"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for name in packages["packages"]["find"]["include"]:
        assert f"!{name.rstrip('*')}/" in ignored, name
