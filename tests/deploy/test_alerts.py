"""The Prometheus alert rules (deploy/prometheus/alerts.yaml), their promtool unit tests
(deploy/prometheus/tests/, one file per rule group), the runbooks they link to
(docs/runbooks.md) and the Grafana dashboard (deploy/grafana/fedbroker.json).

promtool (Debian package ``prometheus``) runs the rule checks and the unit tests; without it
those tests skip with the reason, or fail under FEDBROKER_REQUIRE_SERVICES=1. The structural
checks (every alert complete, linked, tested; only metrics the broker exports) need no tool.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
PROMTOOL_TESTS = ROOT / "deploy" / "prometheus" / "tests"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "fedbroker.json"

RUNBOOK_BASE = "docs/runbooks.md#"
SEVERITIES = frozenset({"page", "ticket", "info"})
GROUP_PREFIX = "fedbroker-"  # group fedbroker-burst is tested by tests/burst.yaml

# What the broker exports at /metrics (counters with their _total), to be cross-checked
# against a live scrape. Alerts and dashboard may use nothing else with the fedbroker_ prefix.
GAUGES = frozenset({
    "fedbroker_gpus",
    "fedbroker_cluster_gpus",
    "fedbroker_largest_gang_gpus",
    "fedbroker_topology_largest_gang_gpus",
    "fedbroker_stranded_gpus",
    "fedbroker_pending_jobs",
    "fedbroker_pending_gpus",
    "fedbroker_oldest_pending_gang_seconds",
    "fedbroker_cluster_stale",
    "fedbroker_cluster_connected",
    "fedbroker_burst_nodes",
    "fedbroker_burst_pool_failing",
    "fedbroker_burst_pool_available",
    "fedbroker_leader",
    "fedbroker_mqtt_connected",
    "fedbroker_event_subscribers",
})  # fmt: skip
COUNTERS = frozenset({
    "fedbroker_cluster_relists_total",
    "fedbroker_burst_scale_ups_total",
    "fedbroker_burst_scale_downs_total",
    "fedbroker_burst_provision_failures_total",
    "fedbroker_burst_node_seconds_total",
    "fedbroker_burst_idle_node_seconds_total",
    "fedbroker_burst_cost_total",
    "fedbroker_jobs_submitted_total",
    "fedbroker_http_requests_total",
    "fedbroker_events_dropped_total",
    "fedbroker_placements_total",
    "fedbroker_gang_timeouts_total",
    "fedbroker_requeues_total",
    "fedbroker_preemptions_total",
    "fedbroker_mqtt_dropped_events_total",
    "fedbroker_placements_skipped_total",
    "fedbroker_scheduling_cycles_cut_short_total",
    "fedbroker_launch_failures_total",
})  # fmt: skip
HISTOGRAMS = frozenset({
    "fedbroker_job_wait_seconds", "fedbroker_placement_decision_seconds",
    "fedbroker_scheduling_cycle_seconds",
})  # fmt: skip
EXPORTED = (
    GAUGES
    | COUNTERS
    | {f"{name}{suffix}" for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
)
METRIC_NAME = re.compile(r"\bfedbroker_[a-z0-9_]*[a-z0-9]")


# --- loading ------------------------------------------------------------------------------


def _load_yaml(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path}: not a YAML mapping"
    return cast(dict[str, Any], doc)


def _groups() -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], _load_yaml(RULES)["groups"])


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in _groups() for rule in group["rules"] if "alert" in rule]


def _test_files() -> list[Path]:
    return sorted(PROMTOOL_TESTS.glob("*.yaml"))


def _dashboard() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(DASHBOARD.read_text()))


def _dashboard_exprs() -> list[str]:
    exprs = [str(t["expr"]) for p in _dashboard()["panels"] for t in p.get("targets", [])]
    for var in _dashboard()["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(str(var["definition"]))
    return exprs


def _minutes(duration: str) -> float:
    """A Prometheus duration of one unit (30m, 2h, 90s) in minutes."""
    match = re.fullmatch(r"(\d+)([smhd])", duration)
    assert match, f"unsupported duration {duration!r}"
    return int(match[1]) * {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}[match[2]]


def _github_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation out, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _runbook_sections() -> dict[str, str]:
    """Anchor -> body of each ``## `` section of docs/runbooks.md."""
    parts = re.split(r"^## (.+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    return {_github_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


# --- promtool -------------------------------------------------------------------------------


@pytest.fixture
def promtool() -> str:
    """promtool's path; skips (or fails under FEDBROKER_REQUIRE_SERVICES=1) without it."""
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool not found on PATH (install the Debian package prometheus)"
        if os.environ.get("FEDBROKER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (FEDBROKER_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    return path


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_checks_the_rules(promtool: str) -> None:
    result = _run(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(group["rules"]) for group in _groups())
    assert f"SUCCESS: {rules} rules found" in result.stdout + result.stderr


@pytest.mark.parametrize("test_file", _test_files(), ids=lambda path: path.name)
def test_promtool_unit_tests_pass(promtool: str, test_file: Path) -> None:
    result = _run(promtool, "test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_dashboard_queries_parse(promtool: str, tmp_path: Path) -> None:
    """Every dashboard query, with Grafana's variables filled in, is valid PromQL."""
    fill = {"$__rate_interval": "5m", "$cluster": ".*", "$queue": ".*", "$pool": ".*"}
    rules = []
    for i, expr in enumerate(_dashboard_exprs()):
        if expr.startswith("label_values("):
            continue  # Grafana's variable query syntax, not PromQL
        for variable, value in fill.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unfilled variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _run(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


# --- the rules ------------------------------------------------------------------------------


def test_every_alert_is_complete() -> None:
    alerts = _alerts()
    assert len(alerts) >= 8
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"Fedbroker[A-Z][A-Za-z]+", name), name
        assert _minutes(str(rule.get("for", "0s"))) > 0, f"{name}: no for"
        assert rule.get("labels", {}).get("severity") in SEVERITIES, f"{name}: severity"
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            assert str(annotations.get(key, "")).strip(), f"{name}: no {key}"
        # The labels an alert is split by are named in its description.
        for by in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            for label in filter(None, (x.strip() for x in by.split(","))):
                assert f"$labels.{label}" in annotations["description"], f"{name}: {label}"


def test_alert_names_are_unique() -> None:
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names))


def test_the_required_alerts_exist() -> None:
    names = {rule["alert"] for rule in _alerts()}
    assert names >= {
        "FedbrokerCapacityShortage",
        "FedbrokerGangPendingTooLong",
        "FedbrokerClusterUnreachable",
        "FedbrokerStrandedGpus",
        "FedbrokerBurstFailed",
        "FedbrokerBurstNodesIdle",
        "FedbrokerBrokerDown",
        "FedbrokerNoLeader",
    }
    down = next(r for r in _alerts() if r["alert"] == "FedbrokerBrokerDown")
    assert down["expr"].strip() == 'absent(up{job="fedbroker"} == 1)'


def test_runbook_urls_point_to_runbook_sections() -> None:
    sections = _runbook_sections()
    linked = set()
    for rule in _alerts():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), url
        anchor = url.removeprefix(RUNBOOK_BASE)
        assert anchor == rule["alert"].lower(), url
        assert anchor in sections, f"no heading for #{anchor} in {RUNBOOKS.name}"
        body = sections[anchor]
        for part in ("**Confirm.**", "**Act.**", "**Escalate**"):
            assert part in body, f"runbook #{anchor}: no {part}"
        severity = rule["labels"]["severity"]
        assert f"**Severity: {severity}.**" in body, f"runbook #{anchor}: severity"
        linked.add(anchor)
    assert set(sections) == linked, f"runbook sections of no alert: {set(sections) - linked}"


def test_one_promtool_test_file_per_group() -> None:
    files = {path.name for path in _test_files()}
    expected = set()
    for group in _groups():
        assert group["name"].startswith(GROUP_PREFIX), group["name"]
        expected.add(group["name"].removeprefix(GROUP_PREFIX) + ".yaml")
    assert files == expected


def _evaluations(test_file: Path) -> list[tuple[str, list[tuple[str, float, int]]]]:
    """Per test of a promtool file: (alertname, eval minute, alerts expected) per check."""
    doc = _load_yaml(test_file)
    assert [(test_file.parent / f).resolve() for f in doc["rule_files"]] == [RULES]
    out = []
    for test in doc["tests"]:
        checks = [
            (c["alertname"], _minutes(c["eval_time"]), len(c.get("exp_alerts") or []))
            for c in test.get("alert_rule_test", [])
        ]
        out.append((str(test["name"]), checks))
    return out


@pytest.mark.parametrize("group", _groups(), ids=lambda group: str(group["name"]))
def test_every_alert_is_tested_firing_on_time_and_quiet(group: dict[str, Any]) -> None:
    """For each alert of the group, its file has a test where it is quiet one evaluation
    before it fires (the ``for`` boundary), and a test where it never fires at any check, one
    of them at or after its ``for``."""
    path = PROMTOOL_TESTS / (group["name"].removeprefix(GROUP_PREFIX) + ".yaml")
    doc = _load_yaml(path)
    step = _minutes(doc.get("evaluation_interval", "1m"))
    tests = _evaluations(path)
    tested = {name for _, checks in tests for name, _, _ in checks}
    alerts = {rule["alert"]: rule for rule in group["rules"] if "alert" in rule}
    assert tested == set(alerts), f"{path.name} tests {tested}, the group has {set(alerts)}"
    for name, rule in alerts.items():
        boundary = quiet = False
        for _, checks in tests:
            mine = {at: n for alert, at, n in checks if alert == name}
            if not mine:
                continue
            if any(n > 0 and mine.get(at - step) == 0 for at, n in mine.items()):
                boundary = True
            if all(n == 0 for n in mine.values()) and max(mine) >= _minutes(rule["for"]):
                quiet = True
        assert boundary, f"{name}: no test quiet at t and firing at t+{step}m"
        assert quiet, f"{name}: no test where it never fires"


# --- metric names ---------------------------------------------------------------------------


def test_alerts_use_only_exported_metrics() -> None:
    used = {m for rule in _alerts() for m in METRIC_NAME.findall(rule["expr"])}
    assert "fedbroker_pending_gpus" in used  # the pattern finds names at all
    assert used <= EXPORTED, f"not exported: {sorted(used - EXPORTED)}"


def test_dashboard_uses_only_exported_metrics() -> None:
    used = {m for expr in _dashboard_exprs() for m in METRIC_NAME.findall(expr)}
    assert "fedbroker_job_wait_seconds_bucket" in used
    assert used <= EXPORTED, f"not exported: {sorted(used - EXPORTED)}"


def test_metric_name_pattern() -> None:
    found = METRIC_NAME.findall('rate(fedbroker_x_total{job="fedbroker"}[5m]) / fedbroker_y')
    assert found == ["fedbroker_x_total", "fedbroker_y"]


# --- the dashboard --------------------------------------------------------------------------


def test_dashboard_panels_have_titles_and_queries() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    panels = dashboard["panels"]
    assert len(panels) >= 10
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert str(panel.get("title", "")).strip(), f"panel {panel['id']}: no title"
        targets = panel.get("targets", [])
        assert targets, f"{panel['title']}: no targets"
        for target in targets:
            assert str(target.get("expr", "")).strip(), f"{panel['title']}: empty expr"


def test_dashboard_datasource_is_a_variable() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in _dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize(
    "pattern",
    [
        r"fedbroker_gpus\b.*\bstate\b",
        r"fedbroker_largest_gang_gpus",
        r"fedbroker_topology_largest_gang_gpus",
        r"fedbroker_stranded_gpus",
        r"fedbroker_pending_jobs",
        r"fedbroker_pending_gpus",
        r"fedbroker_oldest_pending_gang_seconds",
        r"histogram_quantile\(0\.5, .*fedbroker_job_wait_seconds_bucket",
        r"histogram_quantile\(0\.95, .*fedbroker_job_wait_seconds_bucket",
        r"histogram_quantile\(0\.99, .*fedbroker_placement_decision_seconds_bucket",
        r"by \(.*result.*\) \(rate\(fedbroker_placements_total",
        r"fedbroker_burst_nodes",
        r"fedbroker_burst_cost_total",
        r"fedbroker_cluster_connected",
        r"fedbroker_cluster_stale",
    ],
)
def test_dashboard_shows(pattern: str) -> None:
    assert any(re.search(pattern, expr) for expr in _dashboard_exprs()), pattern
