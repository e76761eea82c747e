"""Every kind of secret a config holds or names is known to the log redactor
(broker/cli/logs.py ``secrets_of``): one row per kind, each putting one canary in one
place (static tokens, the store's and MQTT's passwords, agents' command keys, the
kubeconfigs of member clusters and Cluster API pools in every form client-go reads, the
TLS keys of the API and of MQTT). Each canary is then sent through every handler
``configure_logging`` installs (the process's log on stderr and the audit file), in a
message, its arguments, an exception and an extra field, under the loggers that write
(ours, aiohttp's server and access logs, the audit trail), and must appear nowhere."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.cli.logs import configure_logging, secrets_of
from broker.config import parse_config

CANARY = "canary-4c1d9e7b2a6f8e3d5c0b9a7f1e2d3c4b"
# A private key's PEM whose body line is the canary (what a log might show of a key).
PEM = f"-----BEGIN PRIVATE KEY-----\n{CANARY}\n-----END PRIVATE KEY-----\n"

BASE = """
store: {{url: "{store}"}}
clusters:
- name: sim
  source: {{simulated: {{shapes: [{{gpuType: A100, gpus: 8, cpu: "8", memory: 64Gi, count: 1}}]}}}}
{clusters}
queues: [{{name: training}}]
tenants:
- {{name: team-a, defaultQueue: training, token: {token}{tokens}}}
{rest}
"""
PLAIN_TOKEN = "{value: plain-token-0123456789abcdef0123}"


def kubeconfig(user: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "m",
        "clusters": [{"name": "m", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "contexts": [{"name": "m", "context": {"cluster": "m", "user": "u"}}],
        "users": [{"name": "u", "user": user}],
    }  # fmt: skip


def member(source: str) -> str:
    return f"- name: kube\n  source: {{kube: {{context: m, {source}}}}}"


def in_file(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def agent(key: str, environ: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    cluster = f"- name: edge\n  source: {{mqtt: {{commandKey: {key}}}}}"
    return {"clusters": cluster, "rest": "events: {mqtt: {host: m}}"}, environ


Row = Callable[[Path], tuple[dict[str, str], dict[str, str]]]  # -> (BASE fields, environ)
ROWS: list[tuple[str, Row]] = [
    ("static token, inline", lambda t: ({"token": f"{{value: {CANARY}}}"}, {})),
    ("static token, from the environment",
     lambda t: ({"token": "{env: TEAM_A_TOKEN}"}, {"TEAM_A_TOKEN": CANARY})),
    ("named token", lambda t: (
        {"tokens": f", tokens: [{{name: ci, value: {CANARY}, roles: [read]}}]"}, {})),
    ("database URL password",
     lambda t: ({"store": f"postgresql://fedbroker:{CANARY}@db:5432/fedbroker"}, {})),
    ("MQTT password, inline", lambda t: (
        {"rest": f"events: {{mqtt: {{host: m, username: u, password: {{value: {CANARY}}}}}}}"},
        {})),
    ("MQTT password, from the environment", lambda t: (
        {"rest": "events: {mqtt: {host: m, username: u, password: {env: MQTT_PASSWORD}}}"},
        {"MQTT_PASSWORD": CANARY})),
    ("agent command key, inline", lambda t: agent(f"{{value: {CANARY}}}", {})),
    ("agent command key, from the environment",
     lambda t: agent("{env: EDGE_KEY}", {"EDGE_KEY": CANARY})),
    ("agent command key, a file",
     lambda t: agent(f"{{file: {in_file(t, 'key', CANARY + chr(10))}}}", {})),
    ("member kubeconfig token, a file", lambda t: ({"clusters": member(
        f"kubeconfig: {in_file(t, 'kc', json.dumps(kubeconfig({'token': CANARY})))}")}, {})),
    ("member kubeconfig token, inline", lambda t: ({"clusters": member(
        f"kubeconfigInline: {json.dumps(kubeconfig({'token': CANARY}))}")}, {})),
    ("member kubeconfig token, inline YAML text", lambda t: ({"clusters": member(
        f"kubeconfigInline: {json.dumps(json.dumps(kubeconfig({'token': CANARY})))}")}, {})),
    ("member client key, client-key-data", lambda t: ({"clusters": member(
        "kubeconfigInline: " + json.dumps(kubeconfig(
            {"client-certificate-data": "Y2VydA==",
             "client-key-data": base64.b64encode(PEM.encode()).decode()})))}, {})),
    ("member client key, a file next to the kubeconfig", lambda t: ({"clusters": member(
        "kubeconfig: " + in_file(t, "kc", json.dumps(kubeconfig(
            {"client-certificate": "c.pem",
             "client-key": Path(in_file(t, "k.pem", PEM)).name}))))}, {})),
    ("member token file", lambda t: ({"clusters": member(
        "kubeconfigInline: " + json.dumps(kubeconfig(
            {"tokenFile": in_file(t, "token", CANARY + "\n")})))}, {})),
    ("member basic-auth password", lambda t: ({"clusters": member(
        "kubeconfigInline: " + json.dumps(kubeconfig(
            {"username": "admin", "password": CANARY})))}, {})),
    ("member auth-provider refresh token", lambda t: ({"clusters": member(
        "kubeconfigInline: " + json.dumps(kubeconfig({"auth-provider": {
            "name": "oidc", "config": {"client-id": "k", "refresh-token": CANARY}}})))}, {})),
    ("member exec plugin environment", lambda t: ({"clusters": member(
        "kubeconfigInline: " + json.dumps(kubeconfig({"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "get-token",
            "env": [{"name": "SECRET", "value": CANARY}]}})))}, {})),
    ("Cluster API pool kubeconfig token", lambda t: ({"rest": (
        "burstPools: [{name: p, cluster: sim, source: {capi: {context: m, namespace: n, "
        f"name: md, kubeconfigInline: {json.dumps(kubeconfig({'token': CANARY}))}}}}}}}]")},
        {})),
    ("API TLS key", lambda t: ({"rest": (
        f"api: {{tls: {{certFile: {in_file(t, 'tls.crt', 'cert')}, "
        f"keyFile: {in_file(t, 'tls.key', PEM)}}}}}")}, {})),
    ("MQTT TLS key", lambda t: ({"rest": (
        f"events: {{mqtt: {{host: m, tls: {{certFile: {in_file(t, 'mqtt.crt', 'cert')}, "
        f"keyFile: {in_file(t, 'mqtt.key', PEM)}}}}}}}")}, {})),
]  # fmt: skip


def _log_everywhere() -> None:
    """The canary in every part of a record, under every logger that writes."""
    for name in ("broker.service", "aiohttp.server", "aiohttp.access", "fedbroker.audit"):
        logger = logging.getLogger(name)
        logger.warning(f"seen {CANARY} here")
        logger.warning("argument %s", CANARY, extra={"field": {"nested": [CANARY]}})
        try:
            raise RuntimeError(f"failed with {CANARY}")
        except RuntimeError:
            logger.exception("an error")


@pytest.mark.parametrize("make", [r[1] for r in ROWS], ids=[r[0] for r in ROWS])
def test_every_secret_of_the_config_is_redacted_by_every_handler(
    make: Row, tmp_path: Path, real_logging: None, capfd: pytest.CaptureFixture[str]
) -> None:
    fields, environ = make(tmp_path)
    values = {"store": f"sqlite:///{tmp_path / 'x.db'}", "clusters": "", "token": PLAIN_TOKEN,
              "tokens": "", "rest": "", **fields}  # fmt: skip
    config = parse_config(BASE.format(**values), "test config", environ=environ)
    found = secrets_of(config, environ)
    assert CANARY in found
    audit_file = tmp_path / "audit.log"
    configure_logging(logging.DEBUG, secrets=found, audit_file=str(audit_file))
    _log_everywhere()
    logging.getLogger("fedbroker.audit").handlers[0].flush()
    _, err = capfd.readouterr()
    written = err + audit_file.read_text()
    assert CANARY not in written
    assert written.count("***") >= 4 * 3  # each logger's three records carried it, blanked


def test_the_canary_would_show_without_the_redactor(
    tmp_path: Path, real_logging: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """The rows prove something: a config without the canary leaves it in the output."""
    values = {"store": f"sqlite:///{tmp_path / 'x.db'}", "clusters": "", "token": PLAIN_TOKEN,
              "tokens": "", "rest": ""}  # fmt: skip
    config = parse_config(BASE.format(**values), "test config", environ={})
    configure_logging(logging.DEBUG, secrets=secrets_of(config, {}))
    _log_everywhere()
    _, err = capfd.readouterr()
    assert CANARY in err
