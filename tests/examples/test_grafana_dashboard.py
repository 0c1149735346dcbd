"""examples/grafana/elarion-beat.json: valid JSON with a Prometheus datasource variable,
job and node variables, panels that each have targets, queries that read only metrics
the library exports, and PromQL that promtool parses (each query becomes a recording
rule of a scratch rules file, since ``promtool query`` needs a live server)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.examples.promql import GRAFANA, exported_names, run_promtool, used_names

DASHBOARD = GRAFANA / "elarion-beat.json"
#: what a dashboard's exprs hold besides PromQL: Grafana's variables
_RANGE_VARIABLE = re.compile(r"\$__(rate_interval|interval|range)\b")
_VARIABLE = re.compile(r"\$\{?\w+\}?")


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every target."""
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"]
            for target in panel["targets"]]


def as_promql(expr: str) -> str:
    """A dashboard expr with Grafana's variables replaced the way Grafana would."""
    return _VARIABLE.sub(".*", _RANGE_VARIABLE.sub("5m", expr))


def test_the_dashboard_has_a_datasource_variable_and_job_and_node_variables() -> None:
    board = dashboard()
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "node"):
        assert variables[name]["type"] == "query", name
        assert f", {name})" in variables[name]["definition"], name
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_panel_has_targets_and_the_panels_cover_the_metrics() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), \
            panel["title"]
    text = " ".join(expr for _, expr in exprs())
    # sent vs skipped, skip reasons, claim errors, lateness, runtime, drift and orphans,
    # per-node activity and liveness, clock skew, one-offs
    for needed in ('outcome="skipped"', 'reason=~"claim-error', "histogram_quantile",
                   "elarion_beat_lateness_seconds_bucket", "elarion_beat_runtime_seconds",
                   "elarion_beat_drift_events_total", "elarion_beat_orphan_events_total",
                   "elarion_beat_node_occurrences_total",
                   "elarion_beat_node_last_seen_timestamp_seconds",
                   "elarion_beat_clock_skew_seconds", "elarion_beat_one_offs_total"):
        assert needed in text, needed


def test_every_query_reads_only_metrics_the_library_exports() -> None:
    exported = exported_names()
    queries = exprs() + [
        (v["name"], v["definition"]) for v in dashboard()["templating"]["list"]
        if v["type"] == "query"]
    for title, expr in queries:
        names = used_names(expr)
        assert names, title
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported"


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:panel_{i}", "expr": as_promql(expr)}
             for i, (_, expr) in enumerate(exprs())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", path, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout
