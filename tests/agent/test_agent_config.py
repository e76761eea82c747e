"""The agent's launch config (broker/agent/config.py): a kube member's launch fields plus
the tenants the member runs; a wrong file is one line naming the field."""

from __future__ import annotations

import pytest

from broker.agent.config import parse_launch_config
from broker.agent.policy import TenantPolicy
from broker.config import ConfigError
from broker.manifest import DEFAULT_RESERVED_TAINTS


def test_a_full_launch_config() -> None:
    config = parse_launch_config(
        """
namespacePattern: "ml-{tenant}"
launchMode: pin
gpuResources: [example.com/gpu]
reservedTaints: [dedicated]
tenants:
- {name: team-a, podSecurity: restricted, serviceAccounts: [default, trainer],
   runtimeClassNames: [nvidia]}
- {name: team-b}
""",
        "launch.yaml",
    )
    assert config.launch_mode == "pin" and config.gpu_resources == ["example.com/gpu"]
    policy = config.policy()
    a = policy.tenant("team-a")
    assert isinstance(a, TenantPolicy) and a.level == "restricted"
    assert a.service_accounts == {"default", "trainer"}
    assert a.access.runtime_classes == {"nvidia"} and a.access.reserved_taints == ("dedicated",)
    assert policy.tenant("team-b") == TenantPolicy(access=a.access.of((), ["dedicated"]))
    assert policy.tenant("team-c") == (
        "spec.tenant: 'team-c' is not a tenant of this agent's launch config"
    )


def test_without_tenants_every_tenant_is_baseline_with_the_default_account() -> None:
    policy = parse_launch_config("{}", "launch.yaml").policy()
    tenant = policy.tenant("anyone")
    assert isinstance(tenant, TenantPolicy)
    assert tenant.level == "baseline" and tenant.service_accounts == {"default"}
    assert tenant.access.reserved_taints == DEFAULT_RESERVED_TAINTS
    assert parse_launch_config("{}", "f").launch_mode == "delegate"  # as a kube member's


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("launchMode: push", "launch.yaml: launchMode: "),
        ("tenants: [{name: a, podSecurity: root}]", "launch.yaml: tenants[0].podSecurity: "),
        ("tenants: [{name: a}, {name: a}]",
         "launch.yaml: tenants[1].name: tenant 'a' listed twice"),
        ("namespacePattern: '{tenant}'\ntenants: [{name: default}]",
         "launch.yaml: namespacePattern: tenant 'default' gives namespace 'default'"),
        ("namespace: x", "launch.yaml: namespace: replaced by namespacePattern"),
        ("tenant: []", "launch.yaml: tenant: "),
        ("[1]", "launch.yaml: must be a mapping of launch settings"),
        ("a: 1\na: 2", "launch.yaml: duplicate key"),
        ("a: [", "launch.yaml: invalid YAML"),
    ],
)  # fmt: skip
def test_a_wrong_launch_config_is_one_line_naming_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_launch_config(text, "launch.yaml")
    message = str(error.value)
    assert message.startswith(expected), message
    assert "\n" not in message
