"""examples/prometheus/alerts.yml: promtool accepts it and its unit tests pass
(alerts_test.yml: each alert fires on synthetic series and stays quiet on others), every
metric it reads is one the library exports, and every rule links to its runbook.

promtool comes from Debian's ``prometheus`` package (.ci/install-packages.sh); these
tests fail when it is missing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.examples.promql import PROMETHEUS, ROOT, exported_names, run_promtool, used_names

ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
ALERTING_DOC = ROOT / "docs" / "alerting.md"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert [g["name"] for g in groups] == ["elarion-beat"]
    found: list[dict[str, Any]] = groups[0]["rules"]
    return found


def anchors(markdown: Path) -> set[str]:
    """The heading anchors mkdocs' toc (and GitHub) make: lower case, word characters
    and hyphens, spaces as hyphens."""
    out = set()
    for line in markdown.read_text().splitlines():
        match = re.match(r"#{1,6} +(.+?) *$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower())
            out.add(re.sub(r"[ ]+", "-", slug))
    return out


def test_promtool_checks_the_rules() -> None:
    result = run_promtool("check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout, result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", ALERTS_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "FAILED" not in result.stdout, result.stdout


def test_each_alert_has_a_case_that_fires_and_one_that_must_not() -> None:
    cases = yaml.safe_load(ALERTS_TEST.read_text())
    assert cases["rule_files"] == [ALERTS.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in cases["tests"]:
        for case in test["alert_rule_test"]:
            (fires if case["exp_alerts"] else quiet).add(case["alertname"])
    alerts = {rule["alert"] for rule in rules()}
    assert fires == alerts, f"no firing case for {alerts - fires}"
    assert quiet == alerts, f"no quiet case for {alerts - quiet}"


def test_the_rules_read_only_metrics_the_library_exports() -> None:
    exported = exported_names()
    used = set()
    for rule in rules():
        names = used_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= exported, f"{rule['alert']}: {sorted(names - exported)} not exported"
        used |= names
    # and the rules' unit tests feed the same series
    cases = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fed = {name for test in cases for series in test["input_series"]
           for name in used_names(series["series"])}
    assert fed <= exported, sorted(fed - exported)
    assert "elarion_beat_clock_skew_seconds" in used
    assert "elarion_beat_node_last_seen_timestamp_seconds" in used


def test_each_rule_has_severity_summary_description_and_a_runbook_that_exists() -> None:
    headings = anchors(ALERTING_DOC)
    for rule in rules():
        name = rule["alert"]
        assert rule["expr"].strip() and "for" in rule, name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        notes = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(notes), name
        grouped = re.search(r"sum by \((\w+)\)", rule["expr"])  # job, task or node
        label = f"$labels.{grouped[1]}" if grouped else "$labels.node"
        assert label in notes["summary"] and label in notes["description"], name
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/alerting.md" and anchor == name.lower(), notes["runbook_url"]
        assert anchor in headings, f"docs/alerting.md has no heading for {name}"
