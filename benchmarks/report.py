"""Plots (matplotlib, Agg) and the Markdown report, from the saved results."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from .common import Table, fmt, median


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(saved: dict[str, Any], img: Path) -> list[Path]:
    img.mkdir(parents=True, exist_ok=True)
    sections = saved.get("sections", {})
    out: list[Path] = []
    for name, fn in (("overhead", _overhead), ("throughput", _throughput),
                     ("scaleout", _scaleout), ("latency", _latency), ("failover", _failover)):
        if name in sections:
            out += fn(sections[name], img)
    return out


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _overhead(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    arms = [("elarion", "seconds", "ClaimingScheduler\n(defaults)", "C0"),
            ("elarion", "drained_seconds", "ClaimingScheduler\n(defaults, until the\nevents "
             "are sent)", "C9"),
            ("elarion-noevents", "seconds", "ClaimingScheduler\n(events off)", "C2"),
            ("stock", "seconds", "stock Scheduler", "C7")]
    arms = [a for a in arms if all(a[1] in r[a[0]] for r in res["rounds"])]
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    for i, (kind, key, label, color) in enumerate(arms):
        values = [r[kind][key] for r in res["rounds"]]
        ax.bar(i, median(values), color=color, alpha=0.8, label=label)
        ax.scatter([i] * len(values), values, color="k", s=12, zorder=3)
    ax.set_xticks(range(len(arms)), [a[2] for a in arms], fontsize=8)
    s = res["summary"]
    ax.set_ylabel("seconds to dispatch all (median, dots = rounds)")
    ax.set_title(f"{s['n']} interval entries due at once: ratio ours/stock = "
                 f"{s['ratio_median']:.2f}")
    return [_save(fig, img / "overhead.png")]


def _throughput(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    runs = res["runs"]
    import textwrap

    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.55 * len(runs)))
    labels = ["\n".join(textwrap.wrap(r["label"], 30))
              + f"\n{r['replicas']} replica{'s' if r['replicas'] > 1 else ''}" for r in runs]
    times = [r["time_to_all"] for r in runs]
    palette = {"defaults": "C0", "events-off": "C2", "cold": "C1"}
    colors = [palette.get(r.get("variant", ""), "C7") for r in runs]
    ax.barh(range(len(runs)), times, color=colors, alpha=0.85)
    for i, t in enumerate(times):
        ax.text(t, i, f" {t:.1f}s", va="center", fontsize=8)
    ax.set_yticks(range(len(runs)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(times + [10.0]) * 1.12)
    ax.axvline(10, color="C3", ls="--", lw=1, label="goal, 1 replica (10 s)")
    ax.axvline(6, color="C3", ls=":", lw=1, label="goal, 3 replicas (6 s)")
    for f in res["floors"]:
        ax.axvline(f["wall"] * res["entries"] / f["total"], color="k", lw=1,
                   ls="-" if f["processes"] == 1 else "-.",
                   label=f"publish floor, {f['processes']} process"
                   + ("es" if f["processes"] > 1 else ""))
    ax.set_xlabel(f"seconds from the slot to the last of {res['entries']} messages")
    ax.legend(fontsize=7, loc="lower right")
    return [_save(fig, img / "throughput.png")]


def _scaleout(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    from .scaleout import STOCK

    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    labels: list[str] = []
    for r in res["runs"]:
        if r["label"] not in labels:
            labels.append(r["label"])
    one = [r for r in res["runs"] if r["replicas"] == 1]
    for i, label in enumerate(labels):
        pts = sorted((r["replicas"], r["time_to_all"]) for r in res["runs"]
                     if r["label"] == label)
        if not any(k == 1 for k, _ in pts) and one:  # one replica: run with the default only
            pts = sorted(pts + [(1, one[0]["time_to_all"])])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
                color=f"C{i}")
    ax.axhline(res["baseline"]["time_to_all"], color="k", ls="--", lw=1, label=STOCK)
    ax.set_xlabel("replicas")
    ax.set_ylabel("seconds from the slot to the last message")
    ax.set_title(f"{res['entries']} entries due at one slot")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    out = [_save(fig, img / "scaleout_time.png")]

    rows = [r for r in res["runs"] if r["replicas"] > 1]
    fig, ax = plt.subplots(figsize=(max(7.5, 0.75 * len(rows) + 2), 4.4))
    most = max((len(r["per_node"]) for r in rows), default=0)
    for i, r in enumerate(rows):
        bottom = 0.0
        for j, p in enumerate(sorted(r["per_node"], key=lambda p: p["node"])):
            ax.bar(i, 100 * p["share"], bottom=bottom, color=f"C{j}", edgecolor="white",
                   label=f"node {j + 1}")
            bottom += 100 * p["share"]
    ax.set_xticks(range(len(rows)), [f"{r['replicas']} x\nchunk\n{r.get('chunk', '?')}"
                                     for r in rows], fontsize=7.5)
    ax.set_ylabel("share of the wins (%)")
    ax.set_title(f"Who sends: each node's share of {res['entries']} wins\n(library, by "
                 "replicas and elarion_beat_claim_chunk)", fontsize=10)
    handles, labels_ = ax.get_legend_handles_labels()
    seen = dict(zip(labels_, handles))
    ax.legend([seen[f"node {j + 1}"] for j in range(most)], [f"node {j + 1}" for j in range(most)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    out.append(_save(fig, img / "scaleout_shares.png"))
    return out


def _latency(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for key, label in (("producer_samples", "producer (after_task_publish)"),
                       ("consumer_samples", "consumer (BRPOP)")):
        values = sorted(1000 * v for v in res[key])
        if values:
            ax.plot(values, [100 * (i + 1) / len(values) for i in range(len(values))],
                    label=label)
    ax.set_xlabel("due -> published (ms)")
    ax.set_ylabel("% of messages")
    ax.set_title(f"{res['entries']} entries due at once on {res['replicas']} replicas")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return [_save(fig, img / "latency.png")]


def _failover(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    scen = res["scenarios"]
    fig, ax = plt.subplots(figsize=(8, 1 + 0.6 * len(scen)))
    for i, r in enumerate(scen):
        times = [t for t in r.get("beat_times", []) if -6 <= t <= r["observed_after_kill_s"]]
        ax.scatter(times, [i] * len(times), s=10, marker="|", color="C0" if r["mode"] == "elarion"
                   else "C3")
    ax.axvline(0, color="k", lw=1)
    ax.text(0, len(scen) - 0.5, " SIGKILL", fontsize=8)
    ax.set_yticks(range(len(scen)),
                  [f"{'ClaimingScheduler' if r['mode'] == 'elarion' else 'RedBeat'} / {r['kill']}"
                   for r in scen], fontsize=8)
    ax.set_xlabel("seconds from the kill (each tick = one message of the 1 s job)")
    ax.set_ylim(-0.7, len(scen) - 0.3)
    ax.invert_yaxis()
    return [_save(fig, img / "failover.png")]


# -- Markdown -----------------------------------------------------------------


def _tables(section: dict[str, Any]) -> list[Table]:
    return [Table(t["title"], t["columns"], t["rows"], t["notes"]) for t in section["tables"]]


def _md_tables(section: dict[str, Any]) -> str:
    parts = []
    for t in _tables(section):
        parts.append(f"**{t.title}**\n\n{t.markdown()}")
        if t.notes:
            parts.append("\n".join(f"* {n}" for n in t.notes))
    return "\n\n".join(parts)


def _img(doc: Path, img: Path, name: str) -> str:
    rel = os.path.relpath(img / name, doc.parent)
    return f"![{name}]({rel})"


def write(saved: dict[str, Any], doc: Path, img: Path, plots_: list[Path]) -> None:
    from . import commentary

    doc.parent.mkdir(parents=True, exist_ok=True)
    s = saved["sections"]
    m = saved.get("machine", {})
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks` (see `benchmarks/`); the raw numbers are in "
        "`benchmarks/results/full.json`. These are measurements on one shared, noisy machine, "
        "not guarantees, and no test asserts them. `python -m benchmarks --smoke` runs the "
        "same code at tiny sizes (the test suite does, in `tests/test_benchmarks_smoke.py`).",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in m.items()]
    whole = fmt(float(saved.get("seconds", 0)), 0)
    nproc = m.get("nproc", "?")
    lines += ["", f"Mode: {saved.get('mode')}; whole run {whole} s. "
              "Every process (beat replicas, Redis, PostgreSQL, the benchmark) shares the cores "
              f"above: with 3 or 6 replicas on {nproc} core(s), replicas compete for CPU, which "
              "replicas on separate hosts would not."]
    for rerun in saved.get("reruns", []):
        lines[-1] += (f" Re-run afterwards: {', '.join(rerun['sections'])} ({rerun['date']}, "
                      f"commit {rerun.get('commit')}).")
    rerun_commits = {(k, r.get("commit")) for r in saved.get("reruns", []) for k in r["sections"]}
    other = {k: v.get("commit") for k, v in s.items()
             if v.get("commit") and v.get("commit") != m.get("commit")
             and (k, v.get("commit")) not in rerun_commits}
    if other:
        lines[-1] += (" Sections measured on another library commit than the one above (the "
                      "library changed during the run): "
                      + ", ".join(f"{k}: {c}" for k, c in other.items()) + ".")
    lines += [""]
    lines += commentary.summary(saved)
    order = (("overhead", "1. Overhead", ["overhead.png"]),
             ("throughput", "2. Throughput", ["throughput.png"]),
             ("scaleout", "3. Scale-out", ["scaleout_time.png", "scaleout_shares.png"]),
             ("latency", "4. Latency", ["latency.png"]),
             ("failover", "5. Failover", ["failover.png"]),
             ("percall", "6. Where the time goes", []))
    produced = {p.name for p in plots_}
    for key, title, images in order:
        if key not in s:
            continue
        lines += [f"## {title}", ""]
        lines += commentary.method(key, saved)
        lines += ["", _md_tables(s[key]), ""]
        lines += [_img(doc, img, name) for name in images if name in produced]
        lines += [""]
        lines += commentary.findings(key, saved)
        lines += [""]
    lines += commentary.changes(saved)
    lines += commentary.proposals(saved)
    doc.write_text("\n".join(lines).rstrip() + "\n")


def nan_to_dash(value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt(value)
