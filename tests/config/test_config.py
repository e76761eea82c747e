"""Broker configuration: a full file loads, every mistake names the file and key path, secrets
stay out of errors and reprs, and the built-in demo keeps its contract names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from adapters.simulated import generate_nodes
from broker.config import ConfigError, KubeSource, demo_config, load_config, parse_config
from broker.config.members import RESERVED_NAMESPACES
from broker.core.queue import JobQueue, Pending, QueueSpec
from broker.core.scheduler import PolicyBook
from broker.model import Cluster, Job, PodSet, Resources

FULL = """\
store: {url: "sqlite:///var/lib/fedbroker/broker.db"}
api:
  host: 0.0.0.0
  port: 9090
  bodyLimitBytes: 2097152
  rateLimitPerTenant: {requestsPerSecond: 50, burst: 100}
scheduler:
  cycleSeconds: 0.5
  maxJobsPerCycle: 200
  backoffBaseSeconds: 30
  backoffCapSeconds: 600
  backoffLimit: 5
  starvationSeconds: 120
  staleAfterSeconds: 45
clusters:
- name: onprem-x
  labels: {region: eu}
  source:
    simulated:
      shapes:
      - {gpuType: G2, gpus: 8, cpu: "96", memory: 384Gi, count: 10}
      - {gpuType: T4, gpus: 2, cpu: 104000m, memory: 512Gi, count: 4}
      scale: 0.5
- name: cloud-y
  kind: cloud
  costPerGpuHour: 4.1
  source:
    simulated:
      shapes: [{gpuType: A100, gpus: 8, cpu: 96, memory: 1152Gi, count: 8}]
      launchDelaySeconds: 90
      failureRate: 0.05
queues:
- {name: training, policy: gang, priority: 100, weight: 2, quota: {G2: 64}, borrow: true}
- {name: research, reclaimable: true}
tenants:
- name: team-a
  defaultQueue: training
  queues: [research]
  token: {env: TEAM_A_TOKEN}
- name: ops
  defaultQueue: research
  token: {value: ops-inline-secret-0042-0123456789}
  admin: true
"""

ENV = {"TEAM_A_TOKEN": "team-a-env-secret-0041-0123456789"}
SECRETS = ("team-a-env-secret-0041-0123456789", "ops-inline-secret-0042-0123456789")


def test_full_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(FULL)
    config = load_config(path, ENV)
    assert config.store.sqlite_path == Path("/var/lib/fedbroker/broker.db")
    assert (config.api.host, config.api.port, config.api.body_limit_bytes) == (
        "0.0.0.0",
        9090,
        2 << 20,
    )
    assert config.api.rate_limit_per_tenant.requests_per_second == 50.0
    assert config.scheduler.cycle_seconds == 0.5
    assert config.scheduler.backoff_limit == 5
    onprem, cloud = config.clusters
    assert onprem.to_cluster() == Cluster("onprem-x", {"region": "eu"}, "onprem", 0.0)
    assert cloud.to_cluster() == Cluster("cloud-y", {}, "cloud", 4.1)
    source = onprem.source.simulated
    assert source is not None and onprem.source.kind == "simulated"
    shapes = source.node_shapes()
    assert [(s.gpu_type, s.gpus, s.cpu_milli, s.memory_mib, s.count) for s in shapes] == [
        ("G2", 8, 96_000, 393_216, 10),
        ("T4", 2, 104_000, 524_288, 4),
    ]
    assert len(generate_nodes(shapes, onprem.name, source.scale)) == 7
    assert cloud.source.simulated is not None
    assert cloud.source.simulated.launch_delay_seconds == 90.0
    training = config.queue("training")
    assert training is not None and training.quota == {"G2": 64} and training.weight == 2.0
    assert config.tenant("team-a") is not None
    assert config.tenant("team-a").allowed_queues == {"training", "research"}  # type: ignore[union-attr]
    assert config.authenticate("team-a-env-secret-0041-0123456789") is config.tenant("team-a")
    ops = config.authenticate("ops-inline-secret-0042-0123456789")
    assert ops is not None and ops.admin
    assert config.authenticate("ops-inline-secret-004") is None
    assert config.authenticate("") is None


def test_defaults_follow_the_design() -> None:
    config = parse_config("queues: [{name: default}]", "min.yaml", {})
    assert config.store.url == "sqlite://data/fedbroker.db"
    assert (config.api.host, config.api.port) == ("127.0.0.1", 8080)
    assert config.api.body_limit_bytes == 256 * 1024  # issue 13: was 1 MiB
    s = config.scheduler
    assert (s.cycle_seconds, s.backoff_base_seconds, s.backoff_cap_seconds) == (1.0, 60.0, 3600.0)
    assert s.backoff_limit is None
    queue = config.queues[0]
    assert (queue.policy, queue.priority, queue.weight, queue.borrow, queue.reclaimable) == (
        "auto", 0, 1.0, False, False,
    )  # fmt: skip
    assert config.reserved_taints == [
        "node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master",
    ]  # fmt: skip


@pytest.mark.parametrize("policy", ["fgd-cpu", "fgd-lp"])
def test_a_queue_may_place_its_jobs_by_an_fgd_policy(policy: str) -> None:
    config = parse_config(f"queues: [{{name: inference, policy: {policy}}}]", "q.yaml", {})
    book = PolicyBook(JobQueue([QueueSpec(q.name, q.policy) for q in config.queues]))
    job = Job("j", (PodSet("p", 1, Resources(gpu_milli=500, cpu_milli=1000)),), queue="inference")
    assert book.for_job(Pending(job, 0, 0.0)).name == policy  # the job asks for auto


def test_a_tenants_node_access_is_its_runtime_classes_and_the_reserved_taints() -> None:
    text = QUEUES + TENANT.replace("token:", "runtimeClassNames: [kata, gvisor], token:")
    config = parse_config(text + "reservedTaints: [dedicated]", "t.yaml", {})
    access = config.node_access(config.tenants[0])
    assert access.runtime_classes == {"kata", "gvisor"}
    assert access.reserved_taints == ("dedicated",)
    plain = parse_config(QUEUES + TENANT, "t.yaml", {})
    assert plain.node_access(plain.tenants[0]).runtime_classes == frozenset()


QUEUES = "queues: [{name: a}, {name: b}]\n"
TENANT = (
    "tenants:\n- {name: t, defaultQueue: a, token: {value: s3cr3t-token-value-0123456789abcd}}\n"
)
SIM = "source: {simulated: {shapes: [{gpuType: A100, gpus: 8, cpu: '64', memory: 1Ti, count: 2}]}}"
KUBE = "clusters: [{{name: c, source: {{kube: {{kubeconfig: k, context: x, {}}}}}}}]\n"
PIN = KUBE.format("launchMode: pin")


def tenant_named(name: str) -> str:
    token = "x" * 32
    return QUEUES + f"tenants: [{{name: {name}, defaultQueue: a, token: {{value: {token}}}}}]"


PATTERN = "clusters[0].source.kube.namespacePattern"

ERRORS: list[tuple[str, str, str]] = [
    ("queues:\n- {name: a}\n- {name: b, quota: {A100: -1}}\n",
     "queues[1].quota.A100", "must be >= 0"),
    ("queues: [{name: a, quota: {A 100: 1}}]", 'queues[0].quota["A 100"]', "key "),
    ("queues: [{name: a, weight: 0}]", "queues[0].weight", "must be > 0"),
    ("queues: [{name: a, policy: spread}]", "queues[0].policy", "'fgd-cpu' or 'fgd-lp'"),
    ("queues: [{name: a}, {name: a}]", "queues[1].name", "duplicate name 'a'"),
    ("queues: [{name: Training}]", "queues[0].name", "DNS-1123"),
    ("queues: [{name: a, borrow: yes please}]", "queues[0].borrow", "must be a boolean"),
    ("queues: [{name: a, quotas: {}}]", "queues[0].quotas", "unknown field"),
    (f"clusters: [{{name: c, {SIM}}}, {{name: c, {SIM}}}]", "clusters[1].name", "duplicate"),
    (f"clusters: [{{name: Cluster_1, {SIM}}}]", "clusters[0].name", "DNS-1123"),
    (f"clusters: [{{name: c, kind: edge, {SIM}}}]", "clusters[0].kind", "'onprem' or 'cloud'"),
    (f"clusters: [{{name: c, costPerGpuHour: -1, {SIM}}}]", "clusters[0].costPerGpuHour", ">= 0"),
    ("clusters: [{name: c}]", "clusters[0].source", "required"),
    ("clusters: [{name: c, source: {}}]", "clusters[0].source", "exactly one of: simulated"),
    ("clusters: [{name: c, source: {kube: {context: x}}}]",
     "clusters[0].source.kube.kubeconfig", "give exactly one of: kubeconfig, kubeconfigInline"),
    ("clusters: [{name: c, source: {kube: {kubeconfig: k, context: x, launchMode: p}}}]",
     "clusters[0].source.kube.launchMode", "'delegate' or 'pin'"),
    ("clusters: [{name: c, source: {cloud: {}}}]", "clusters[0].source.cloud", "unknown field"),
    ("clusters: [{name: c, source: {simulated: {shapes: {}}}}]",
     "clusters[0].source.simulated.shapes", "must be a list"),
    ("clusters: [{name: c, source: {simulated: {}}}]\nburstPools: [{name: p, cluster: d, "
     "source: {simulated: {}}}]", "burstPools[0].gpuType", "required for a simulated pool"),
    ("clusters: [{name: c, source: {simulated: {}}}]\nburstPools: [{name: p, cluster: d, "
     "gpuType: A, gpus: 8, cpu: 1, memory: 1Gi, maxNodes: 2, source: {simulated: {}}}]",
     "burstPools[0].cluster", "no cluster named 'd'"),
    ("clusters: [{name: c, source: {simulated: {}}}]\nburstPools: [{name: p, cluster: c, "
     "gpuType: A, gpus: 8, cpu: 1, memory: 1Gi, minNodes: 3, maxNodes: 2, "
     "source: {simulated: {}}}]", "burstPools[0].minNodes", "must be <= maxNodes"),
    ("clusters: [{name: c, source: {simulated: {}}}]\nburstPools: [{name: p, cluster: c, "
     "source: {capi: {context: m, namespace: n, name: md}}}]",
     "burstPools[0].source.capi.kubeconfig", "give exactly one of"),
    ("clusters: [{name: c, source: {simulated: {failureRate: 2, shapes: "
     "[{gpuType: A, gpus: 1, cpu: 1, memory: 1Gi, count: 1}]}}}]",
     "clusters[0].source.simulated.failureRate", "<= 1"),
    ("clusters: [{name: c, source: {simulated: {scale: 100, shapes: "
     "[{gpuType: A, gpus: 1, cpu: 1, memory: 1Gi, count: 1000}]}}}]",
     "clusters[0].source.simulated.scale", "at most 50000"),
    ("clusters: [{name: c, source: {simulated: {shapes: "
     "[{gpuType: A, gpus: 1, cpu: 1, memory: lots, count: 1}]}}}]",
     "clusters[0].source.simulated.shapes[0].memory", 'not a quantity: "lots"'),
    (QUEUES + "tenants: [{name: t, defaultQueue: c, token: {value: x}}]",
     "tenants[0].defaultQueue", "no queue named 'c'"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, queues: [b, z], token: {value: x}}]",
     "tenants[0].queues[1]", "no queue named 'z'"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, token: {}}]", "tenants[0].token",
     "exactly one of: env, value"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, "
     "token: {env: X, value: s3cr3t-token-value-0123456789abcd}}]",
     "tenants[0].token", "exactly one of: env, value"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, token: {env: NOT_SET_ANYWHERE}}]",
     "tenants[0].token.env", "environment variable NOT_SET_ANYWHERE is not set"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, token: {env: 1BAD}}]",
     "tenants[0].token.env", "pattern"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, token: {value: ''}}]",
     "tenants[0].token.value", "token is empty"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, token: {value: 12345}}]",
     "tenants[0].token.value", "must be a string"),
    (QUEUES + TENANT
     + "- {name: u, defaultQueue: b, token: {value: s3cr3t-token-value-0123456789abcd}}",
     "tenants[1].token", "same token as token 't'"),
    (QUEUES + TENANT + "- {name: t, defaultQueue: b, token: {value: other}}",
     "tenants[1].name", "duplicate name 't'"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, runtimeClassNames: [kata, Kata_RT], "
     "token: {value: x}}]", "tenants[0].runtimeClassNames[1]", "pattern"),
    (QUEUES + "tenants: [{name: t, defaultQueue: a, runtimeClassNames: kata, "
     "token: {value: x}}]", "tenants[0].runtimeClassNames", "list"),
    ("reservedTaints: [dedicated, 'node role/x']", "reservedTaints[1]", "pattern"),
    ("reservedTaints: {key: dedicated}", "reservedTaints", "list"),
    (KUBE.format("namespace: fedbroker-jobs"), "clusters[0].source.kube.namespace",
     "replaced by namespacePattern: one namespace per tenant"),
    (KUBE.format("namespacePattern: team"), PATTERN, "around exactly one '{tenant}'"),
    (KUBE.format("namespacePattern: '{tenant}-{tenant}'"), PATTERN, "exactly one"),
    (KUBE.format("namespacePattern: 'Fed-{tenant}'"), PATTERN, "lowercase letters"),
    (KUBE.format("namespacePattern: '-{tenant}'"), PATTERN, "lowercase letters"),
    (KUBE.format("namespacePattern: '{tenant}-'"), PATTERN, "lowercase letters"),
    (KUBE.format("namespacePattern: 'fed_{tenant}'"), PATTERN, "lowercase letters"),
    (KUBE.format("namespacePattern: \"fed-{tenant}\\n\""), PATTERN, "lowercase letters"),
    (KUBE.format("namespacePattern: '{tenant}" + "-x" * 32 + "'"), PATTERN, "at most 62"),
    (KUBE.format("namespacePattern: 5"), PATTERN, "must be a string"),
    (KUBE.format("sharedGpuResource: gpu-milli"), "clusters[0].source.kube.sharedGpuResource",
     "not a domain-qualified extended resource name (e.g. example.com/gpu-milli; "
     "Kubernetes refuses others): 'gpu-milli'"),
    (KUBE.format("sharedGpuResource: kubernetes.io/gpu"),
     "clusters[0].source.kube.sharedGpuResource", "not a domain-qualified"),
    (KUBE.format("sharedGpuResource: 'example.com/'"),
     "clusters[0].source.kube.sharedGpuResource", "not a domain-qualified"),
    (KUBE.format("gpuResources: [nvidia.com/gpu, gpu]"), "clusters[0].source.kube.gpuResources",
     "not a domain-qualified extended resource name (e.g. example.com/gpu-milli; "
     "Kubernetes refuses others): 'gpu'"),
    (KUBE.format("gpuResources: ['Example.com/gpu']"), "clusters[0].source.kube.gpuResources",
     "not a domain-qualified"),
    (KUBE.format("schedulerName: Scheduler_Plugins"), "clusters[0].source.kube.schedulerName",
     "not a DNS-1123 subdomain"),
    (KUBE.format("volcanoQueues: {training: 'ML queue'}"),
     "clusters[0].source.kube.volcanoQueues", "not a DNS-1123 subdomain"),
    (KUBE.format("volcanoQueues: {training: ml}"),
     "clusters[0].source.kube.volcanoQueues.training", "no queue named 'training'"),
    (PIN + tenant_named("t" * 54), PATTERN, "longer than 63 characters"),
    (KUBE.format("namespacePattern: '{tenant}'") + tenant_named("default"), PATTERN,
     "gives 'default' for tenant 'default'"),
    (PIN + tenant_named("jobs"), PATTERN,
     "gives 'fedbroker-jobs' for tenant 'jobs': a namespace reserved"),
    ("api: {port: '8080'}", "api.port", "must be an integer"),
    ("api: {port: 70000}", "api.port", "<= 65535"),
    ("api: {bodyLimitBytes: 10}", "api.bodyLimitBytes", ">= 1024"),
    ("api: {rateLimitPerTenant: {requestsPerSecond: 0}}",
     "api.rateLimitPerTenant.requestsPerSecond", "> 0"),
    ("scheduler: {cycleSeconds: 0}", "scheduler.cycleSeconds", "> 0"),
    ("scheduler: {backoffCapSeconds: 30}", "scheduler.backoffCapSeconds",
     ">= backoffBaseSeconds"),
    ("scheduler: {backoffLimit: -1}", "scheduler.backoffLimit", ">= 0"),
    ("scheduler: {cycle_seconds: 2}", "scheduler.cycle_seconds", "unknown field"),
    ("store: {url: 'mysql://root:pw-secret-77@db/fed'}", "store.url",
     "must start with sqlite:// or postgresql://"),
    ("stores: {}", "stores", "unknown field"),
]  # fmt: skip


def test_delegate_mode_keys_reach_the_member_config() -> None:
    text = QUEUES + KUBE.format(
        "schedulerName: scheduler-plugins-scheduler, volcanoQueues: {a: ml}, "
        "sharedGpuResource: example.com/gpu-milli, gpuResources: [nvidia.com/gpu]"
    )
    kube = parse_config(text, "demo.yaml", {}).clusters[0].source.kube
    assert kube is not None
    assert kube.scheduler_name == "scheduler-plugins-scheduler"
    assert kube.volcano_queues == {"a": "ml"}
    assert kube.shared_gpu_resource == "example.com/gpu-milli"
    default = parse_config(PIN, "demo.yaml", {}).clusters[0].source.kube
    assert default is not None
    assert (default.scheduler_name, default.volcano_queues) == (None, {})


@pytest.mark.parametrize(("text", "path", "fragment"), ERRORS, ids=[e[1] for e in ERRORS])
def test_error_names_file_and_key_path(text: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "demo.yaml", {})
    message = str(caught.value)
    assert message.startswith(f"demo.yaml: {path}: "), message
    assert fragment in message
    assert "\n" not in message
    for secret in ("s3cr3t-token-value-0123456789abcd", "pw-secret-77"):
        assert secret not in message


def test_the_issue_example_message() -> None:
    text = "queues:\n- {name: a}\n- {name: b, quota: {A100: -1}}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "demo.yaml", {})
    assert str(caught.value) == "demo.yaml: queues[1].quota.A100: must be >= 0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "demo.yaml: empty config"),
        ("- a\n- b", "demo.yaml: must be a mapping of sections"),
        ("queues: [", "demo.yaml: invalid YAML at line 1, column 10: expected the node content"),
        ("a: b: c", "demo.yaml: invalid YAML at line 1"),
    ],
)
def test_unreadable_file(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "demo.yaml", {})
    assert str(caught.value).startswith(message)


def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read: No such file"):
        load_config(missing)


def test_environment_tokens_are_read_from_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAM_A_TOKEN", "from-the-environment-0123456789ab")
    config = parse_config(FULL, "broker.yaml")
    assert config.authenticate("from-the-environment-0123456789ab") is config.tenant("team-a")


def test_secrets_never_show() -> None:
    config = parse_config(FULL.replace("sqlite:///var", "postgresql://u:pw-secret-77@db/var"),
                          "broker.yaml", ENV)  # fmt: skip
    shown = [repr(config), str(config), config.model_dump_json(), repr(config.tenants)]
    for text in shown:
        for secret in (*SECRETS, "pw-secret-77"):
            assert secret not in text
    assert config.store.redacted_url == "postgresql://u:***@db/var/lib/fedbroker/broker.db"
    assert config.store.sqlite_path is None
    # A mistake next to a secret does not echo it either.
    broken = FULL.replace("admin: true", "admin: true\n  extra: ops-inline-secret-0042-0123456789")
    with pytest.raises(ConfigError) as caught:
        parse_config(broken, "broker.yaml", ENV)
    assert str(caught.value) == "broker.yaml: tenants[1].extra: unknown field"


TOKENS = {"team-a": "demo-token-a-123", "team-b": "demo-token-b-456", "admin": "demo-token-c-789"}


def test_demo_has_the_contract_names(tmp_path: Path) -> None:
    config = demo_config(tmp_path, TOKENS)
    assert [c.name for c in config.clusters] == ["onprem-a", "onprem-b", "cloud-burst"]
    assert [c.kind for c in config.clusters] == ["onprem", "onprem", "cloud"]
    assert config.clusters[2].cost_per_gpu_hour > 0
    assert {t.name for t in config.tenants} == {"team-a", "team-b", "admin"}
    assert [t.name for t in config.tenants if t.admin] == ["admin"]
    assert {q.name for q in config.queues} == {"training", "inference", "research"}
    assert config.queue("training") is not None
    assert config.store.sqlite_path == tmp_path / "fedbroker.db"
    for tenant, token in TOKENS.items():
        found = config.authenticate(token)
        assert found is not None and found.name == tenant
    for secret in TOKENS.values():
        assert secret not in repr(config)


def test_demo_clusters_are_laptop_sized_real_shapes_without_h100(tmp_path: Path) -> None:
    config = demo_config(tmp_path, TOKENS)
    for cluster in config.clusters:
        source = cluster.source.simulated
        assert source is not None
        nodes = generate_nodes(source.node_shapes(), cluster.name, source.scale)
        types = {n.gpu_type for n in nodes}
        assert "H100" not in types
        if cluster.kind == "onprem":
            assert 20 <= len(nodes) <= 80, (cluster.name, len(nodes))
            assert len(types) >= 3  # mixed GPU types
    shapes = {s.gpu_type for c in config.clusters if c.source.simulated
              for s in c.source.simulated.shapes}  # fmt: skip
    assert "H100" not in shapes


def test_demo_needs_every_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="admin"):
        demo_config(tmp_path, {"team-a": "x", "team-b": "y"})


@pytest.mark.parametrize(
    ("pattern", "tenant", "namespace"),
    [
        (None, "team-a", "fedbroker-team-a"),  # the default
        ("gpu-{tenant}-jobs", "ml", "gpu-ml-jobs"),
        ("{tenant}", "team-a", "team-a"),
        ("{tenant}", "t" * 63, "t" * 63),
        (None, "t" * 53, "fedbroker-" + "t" * 53),
    ],
)
def test_namespace_pattern_gives_each_tenant_its_namespace(
    pattern: str | None, tenant: str, namespace: str
) -> None:
    key = "launchMode: pin" if pattern is None else f"namespacePattern: '{pattern}'"
    config = parse_config(KUBE.format(key) + tenant_named(tenant), "ns.yaml", {})
    source = config.clusters[0].source.kube
    assert source is not None
    assert source.namespace_for(tenant) == namespace
    assert source.namespace_problem(tenant) is None


DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
SHAPE = r"([a-z0-9][-a-z0-9]*)?\{tenant\}([-a-z0-9]*[a-z0-9])?"  # what may be accepted
TENANTS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
# Patterns of that shape (some too long: up to 82 characters besides {tenant}), and text.
SHAPED = r"([a-z0-9][-a-z0-9]{0,40})?\{tenant\}([-a-z0-9]{0,40}[a-z0-9])?"
PATTERNS = st.one_of(
    st.from_regex(SHAPED, fullmatch=True), st.text(alphabet="az09-_.{}tenA \n", max_size=24)
)


@given(pattern=PATTERNS, tenant=TENANTS)
def test_an_accepted_pattern_gives_a_tenant_a_dns_label_or_names_the_problem(
    pattern: str, tenant: str
) -> None:
    fits = re.fullmatch(SHAPE, pattern) is not None and len(pattern) - len("{tenant}") <= 62
    try:
        source = KubeSource.model_validate(
            {"kubeconfig": "k", "context": "x", "namespacePattern": pattern}
        )
    except ValidationError:
        assert not fits, pattern
        return
    assert fits, pattern
    name = source.namespace_for(tenant)
    problem = source.namespace_problem(tenant)
    if problem is None:
        assert re.fullmatch(DNS_LABEL, name) and len(name) <= 63, name
        assert name not in RESERVED_NAMESPACES
    else:
        assert len(name) > 63 or name in RESERVED_NAMESPACES, problem
