"""Plots (matplotlib, Agg) and the Markdown tables, from the saved results.

No prose: the findings are written by hand in docs/benchmarks.md.
"""

from __future__ import annotations

import math
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
                     ("scaleout", _scaleout), ("latency", _latency), ("failover", _failover),
                     ("jitter", _jitter), ("claimstable", _claimstable),
                     ("bigschedule", _bigschedule)):
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


def _jitter(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    base, jit, hourly = res["baseline"], res["jittered"], res["hourly"]
    fig, (ax, cum, hours) = plt.subplots(1, 3, figsize=(13, 3.9),
                                         gridspec_kw={"width_ratios": [2.2, 1.4, 1.4]})
    counts = jit["per_second"]
    top = max(counts) * 2.2
    ax.bar(range(len(counts)), counts, width=0.85, align="edge", color="C0",
           label=f"jitter {res['jitter']:g} s")
    ax.axhline(res["jobs"] / len(counts), color="k", ls="--", lw=1, label="uniform")
    first = base["per_second"][0]
    ax.bar([0], [top], width=0.85, align="edge", color="C3", alpha=0.35, zorder=0,
           label=f"no jitter: {first} in second 0")
    ax.set_ylim(0, top)
    ax.set_xlim(0, len(counts))
    ax.set_xlabel("seconds after the slot")
    ax.set_ylabel("messages published in that second")
    ax.set_title(f"{res['jobs']} jobs on 0 * * * *, {res['nodes']} nodes: chi-square "
                 f"{jit['uniformity']['chi2']:.1f}, p = {jit['uniformity']['p']:.2f}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    for run, label, color in ((base, "no jitter", "C3"), (jit, "jitter", "C0")):
        times = sorted([-1.0] + [p[1] / 1000 for p in run["published"]]
                       + [res["jitter"] + 2.0])
        cum.step(times, [0] + list(range(1, len(times) - 1)) + [len(times) - 2], where="post",
                 color=color, label=label)
    cum.set_xlabel("seconds after the slot")
    cum.set_ylabel("messages published so far")
    cum.set_title("Cumulative", fontsize=9)
    cum.legend(fontsize=7, loc="lower right")
    offsets = [s["offset_ms"] / 1000 for s in hourly["slots"]]
    hours.plot(range(len(offsets)), offsets, marker="o", lw=0.8, color="C2")
    hours.set_ylim(0, res["jitter"])
    hours.set_xlabel("hourly slot")
    hours.set_ylabel("offset (s)")
    hours.set_title(f"One job's offset, {len(offsets)} slots", fontsize=9)
    return [_save(fig, img / "jitter.png")]


def _claimstable(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, layout in enumerate(("plain", "partitioned")):
        runs = sorted((r for r in res["runs"] if r["layout"] == layout), key=lambda r: r["rows"])
        if not runs:
            continue
        rows = [max(r["rows"], 1) for r in runs]  # the empty table on a log axis: at 1
        for key, style in (("p50", "-o"), ("p99", "--^")):
            ax.plot(rows, [r["claims"][key] for r in runs], style, color=f"C{i}",
                    label=f"{layout}, {key}")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("rows already in the claims table (0 drawn at 1)")
    ax.set_ylabel(f"ms per chunk of {res['chunk']} claims")
    values = [r["claims"][k] for r in res["runs"] for k in ("p50", "p99")]
    if values and max(values) > 20 * min(values):  # several orders of magnitude: log
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return [_save(fig, img / "claimstable.png")]


def _bigschedule(res: dict[str, Any], img: Path) -> list[Path]:
    plt = _plt()
    from .bigschedule import KINDS, LABELS

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, ylabel in ((axes[0], "tick_cpu_mean_ms", "CPU ms of one tick that finds "
                             "nothing due (mean)"),
                            (axes[1], "startup_cpu", "start-up CPU s (setup to first tick)")):
        for i, kind in enumerate(KINDS):
            pts = sorted((r["n"], r[key]) for r in res["runs"] if r["kind"] == kind
                         and r["variant"] == "idle" and math.isfinite(r.get(key, math.nan)))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        color=f"C{i}", label=LABELS[kind])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entries in the schedule")
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return [_save(fig, img / "bigschedule.png")]


# -- Markdown tables ----------------------------------------------------------

#: the sections in the order of docs/benchmarks.md, with their titles
TITLES = {"overhead": "1. Overhead", "throughput": "2. Throughput", "scaleout": "3. Scale-out",
          "latency": "4. Latency", "failover": "5. Failover",
          "percall": "6. Where the time goes", "jitter": "7. Jitter",
          "claimstable": "8. Claims table", "bigschedule": "9. Big schedules",
          "capacity": "10. Capacity", "oneoffs": "11. One-offs",
          "liveschedules": "12. Live schedules"}

#: the header's words for measurements taken on a work tree with uncommitted changes
DIRTY = "measured on uncommitted changes"


def dirty(section: dict[str, Any]) -> bool:
    """Measured on a work tree with uncommitted changes (``dirty``; results written
    before that flag existed say so in their ``commit``)."""
    return bool(section.get("dirty")) or "uncommitted" in str(section.get("commit", ""))


def _md_tables(section: dict[str, Any]) -> str:
    parts = []
    for t in section["tables"]:
        table = Table(t["title"], t["columns"], t["rows"], t["notes"])
        parts.append(f"**{table.title}**\n\n{table.markdown()}")
        if table.notes:
            parts.append("\n".join(f"* {n}" for n in table.notes))
    return "\n\n".join(parts)


def _header(saved: dict[str, Any]) -> list[str]:
    sections = saved["sections"]
    marked = [k for k in TITLES if k in sections and dirty(sections[k])]
    title = "# Benchmark tables" + (f" ({DIRTY})" if marked else "")
    lines = [title, ""]
    if marked:
        lines += [f"**Sections {DIRTY}: {', '.join(marked)}.** No commit holds the code "
                  "they measured.", ""]
    lines += [f"Written by `python -m benchmarks` ({saved.get('mode')} mode, "
              f"{fmt(float(saved.get('seconds', 0)), 0)} s) from its results JSON. Tables only: "
              "the findings are written by hand in docs/benchmarks.md.", "",
              "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in saved.get("machine", {}).items()]
    for rerun in saved.get("reruns", []):
        lines += ["", f"Re-run: {', '.join(rerun['sections'])} ({rerun['date']}, commit "
                      f"{rerun.get('commit')})."]
    return lines


def write(saved: dict[str, Any], path: Path) -> None:
    """Write every section's tables to *path* (Markdown), under :func:`_header`."""
    lines = _header(saved)
    for key, title in TITLES.items():
        section = saved["sections"].get(key)
        if section is None:
            continue
        lines += ["", f"## {title}", "",
                  f"Commit {section.get('commit')}" + (f", {DIRTY}" if dirty(section) else "")
                  + f"; {fmt(float(section.get('seconds', 0)), 0)} s.", "",
                  _md_tables(section)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")
