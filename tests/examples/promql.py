"""What the Prometheus examples' tests share: promtool, the metric names the library
exports (from the registry of :class:`~celery_elarion_beat.observe.metrics.OccurrenceCounters`),
and the metric names a PromQL expression uses."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry

from celery_elarion_beat.observe.metrics import OccurrenceCounters
from celery_elarion_beat.operate.coverage_metrics import EveryNodeGauge

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "examples" / "prometheus"
GRAFANA = ROOT / "examples" / "grafana"

#: the sample names prometheus_client writes for a metric family of each type
_SAMPLES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
_NAME = re.compile(r"elarion_beat_[a-z_]+")


def promtool() -> str:
    """The promtool binary; fails (never skips) when it is missing."""
    found = shutil.which("promtool")
    assert found, "promtool is missing: run .ci/install-packages.sh (Debian's prometheus)"
    return found


def run_promtool(*args: str | Path, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def exported_names() -> set[str]:
    """Every ``elarion_beat_*`` sample name the library's metrics write: the families
    :class:`OccurrenceCounters` registers, and the gauge read from the claims database
    (:class:`EveryNodeGauge`), named the way prometheus_client names their samples (a
    counter ``x`` is ``x_total``, a histogram ``x_bucket``/``x_sum``/``x_count``)."""
    registry = CollectorRegistry()
    OccurrenceCounters(registry)
    families = [*registry.collect(), *EveryNodeGauge().describe()]
    names = {family.name + suffix for family in families
             if family.name.startswith("elarion_beat_") for suffix in _SAMPLES[family.type]}
    assert names, "OccurrenceCounters registered no elarion_beat_* metric"
    return names


def used_names(expr: str) -> set[str]:
    """The ``elarion_beat_*`` metric names in a PromQL expression."""
    return set(_NAME.findall(expr))
