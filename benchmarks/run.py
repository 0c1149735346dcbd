"""The one command: ``python -m benchmarks [--smoke] [--only SECTION,...]``.

Full mode runs every benchmark at the sizes of the issue (about 10 minutes on
a 2-core machine), prints the tables, writes the raw results to
``benchmarks/results/full.json``, the tables to ``benchmarks/results/tables.md``
and the plots to ``docs/img/``. It writes no prose: docs/benchmarks.md is
written by hand from those. ``--smoke`` runs tiny sizes (well under a minute)
and writes into a temporary directory only, never into the repository.
``--only`` runs some sections and merges them into the saved results before
the tables are written again.

It refuses to run on a work tree with uncommitted changes (``git status
--porcelain``), so that every figure names the commit it was measured on; with
``--allow-dirty`` it runs anyway and the tables' header says "measured on
uncommitted changes".

Services: PostgreSQL (``ELARION_BENCH_PG_DSN``, default
``postgresql://postgres@127.0.0.1:5432/test``) and Redis
(``ELARION_BENCH_REDIS_URL``, default ``redis://127.0.0.1:6379/0``); the
``ELARION_TEST_*`` variables of the test suite are honoured too. Every table,
queue and key a run creates is named ``elbench...`` and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import (
    bigschedule,
    capacity,
    claimstable,
    compare,
    failover,
    jitter,
    latency,
    live_schedules,
    one_offs,
    overhead,
    percall,
    report,
    scaleout,
    throughput,
)
from .common import (
    PG_DSN,
    REDIS_URL,
    ROOT,
    Table,
    cleanup_leftovers,
    commit,
    machine,
    uncommitted,
)

SECTIONS = ("overhead", "throughput", "scaleout", "latency", "failover", "percall", "jitter",
            "claimstable", "bigschedule", "capacity", "oneoffs", "liveschedules")

#: sizes per mode
FULL: dict[str, Any] = {
    "overhead": {"n": 1000, "rounds": 7, "warmup": 1, "sweep": (10, 100)},
    "throughput": {"entries": 10_000, "floor_total": 10_000, "heartbeat": 1.0},
    "scaleout": {"entries": 3000, "counts": (1, 2, 3, 6), "chunks": (None, 500, 250),
                 "reps": 2, "heartbeat": 1.0},
    "latency": {"entries": 100, "replicas": 3, "period": 5, "slots": 8,
                "repeat_entries": 3000, "repeat_period": 5, "repeat_slots": 3},
    "failover": {"beats": 3, "load": 300, "load_period": 5, "max_interval": 5.0, "warm": 6.0,
                 "after_elarion": 12.0, "kills": ("quiet", "mid-batch")},
    "percall": {"n": 2000, "repeats": 5},
    "jitter": {"jobs": 1000, "jitter": 60.0, "step": 0.05, "nodes": 3, "hours": 24},
    # hours, not minutes: up to 100 million rows per layout (a partitioned fill estimated
    # over 45 minutes is skipped)
    "claimstable": {"rows": {"plain": (0, 10_000_000, 100_000_000),
                             "partitioned": (0, 10_000_000, 100_000_000)},
                    "jobs": 10_000, "chunk": 1000, "chunks": 30, "purge_rows": 10_000_000,
                    "purge_keep_days": 4.0,
                    "fill_budget_s": {"partitioned": 45 * 60}},
    # 20 minutes up to 100,000 entries, an hour or more with 1,000,000 (each arm builds,
    # sets up and ticks them in Python); the one-seconds-entry variant at the smaller sizes
    "bigschedule": {"sizes": (10_000, 100_000, 1_000_000), "idle": 30.0, "ticks": 50,
                    "tick_budget": 60.0, "seconds_sizes": (10_000, 100_000), "limit": 3600.0},
    # a few minutes: 1 and 3 nodes claiming 10,000 entries, 1-8 concurrent claimers, run tracking
    "capacity": {"entries": 10_000, "chunk": 1000, "rounds": 3, "nodes": (1, 3),
                 "saturation": (1, 2, 4, 8), "seconds": 6.0, "runs": 1000,
                 "run_batches": (1, 100), "window_s": 15.0},
    # 100,000 one-offs due within a minute on 3 real beats: a few minutes
    "oneoffs": {"one_offs": 100_000, "nodes": 3, "window": 60.0, "lead": 30.0},
    # 1,000 edits on 5 real beats, twice (NOTIFY, poll); 10,000 database entries: ~15 min
    "liveschedules": {"edits": 1000, "nodes": 5, "spacing": 0.2, "entries": 10_000,
                      "edit_ticks": 20, "proc_nodes": 3, "idle": 30.0, "due": 100,
                      "window": 20.0, "burst_rate": 100.0},
}
SMOKE: dict[str, Any] = {
    "overhead": {"n": 50, "rounds": 2, "warmup": 0, "sweep": ()},
    "throughput": {"entries": 200, "floor_total": 200, "with_events_off": False,
                   "with_cold": False, "lead": 0.8, "heartbeat": 0.5},
    "scaleout": {"entries": 100, "counts": (1, 2), "chunks": (None, 25), "lead": 0.6,
                 "heartbeat": 0.5},
    "latency": {"entries": 20, "replicas": 2, "period": 2, "slots": 2, "lead": 0.8,
                "repeat_entries": 50, "repeat_period": 1, "repeat_slots": 2},
    "failover": {"beats": 2, "load": 20, "load_period": 2, "max_interval": 1.0, "warm": 1.0,
                 "after_elarion": 3.0, "after_redbeat": 7.0, "kills": ("quiet",)},
    "percall": {"n": 200, "repeats": 1},
    "jitter": {"jobs": 60, "jitter": 60.0, "step": 0.25, "nodes": 3, "hours": 3},
    "claimstable": {"rows": {"plain": (0, 20_000), "partitioned": (0, 20_000)}, "jobs": 2000,
                    "chunk": 500, "chunks": 4, "purge_rows": 20_000},
    "bigschedule": {"sizes": (200, 1000), "idle": 3.0, "ticks": 20, "tick_budget": 5.0,
                    "seconds_sizes": (1000,), "limit": 120.0, "parallel": True},
    "capacity": {"entries": 200, "chunk": 100, "rounds": 1, "nodes": (1, 2),
                 "saturation": (1, 2), "seconds": 0.5, "runs": 10, "run_batches": (1, 10),
                 "window_s": 2.0},
    "oneoffs": {"one_offs": 300, "nodes": 2, "window": 2.0, "lead": 8.0, "batch": 50},
    "liveschedules": {"edits": 10, "nodes": 2, "spacing": 0.2, "entries": 200,
                      "edit_ticks": 3, "proc_nodes": 1, "idle": 2.0, "due": 5, "window": 4.0,
                      "burst_rate": 20.0},
}


def _check_services() -> None:
    for url, variable in ((PG_DSN, "ELARION_BENCH_PG_DSN"), (REDIS_URL, "ELARION_BENCH_REDIS_URL")):
        parsed = urlparse(url)
        try:
            socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 0),
                                     timeout=3).close()
        except OSError as exc:
            raise SystemExit(f"benchmarks: {url} is not reachable ({exc}); start the service "
                             f"or point {variable} at one") from None


#: the module of each section: ``run(**sizes)`` measures, ``tables(result)`` tabulates
MODULES: dict[str, Any] = {"overhead": overhead, "throughput": throughput,
                           "scaleout": scaleout, "latency": latency, "failover": failover,
                           "percall": percall, "jitter": jitter,
                           "claimstable": claimstable, "bigschedule": bigschedule,
                           "capacity": capacity, "oneoffs": one_offs,
                           "liveschedules": live_schedules}


def _section(name: str, sizes: dict[str, Any]) -> tuple[dict[str, Any], list[Table]]:
    module = MODULES[name]
    result: dict[str, Any] = module.run(**sizes)
    return result, module.tables(result)


def _refuse_dirty(allow_dirty: bool) -> bool:
    """Whether the work tree has uncommitted changes; exit unless *allow_dirty*."""
    changes = uncommitted()
    if changes == []:
        return False
    if allow_dirty:
        return True
    what = ("git cannot tell whether it has any (not a git checkout?)" if changes is None
            else "it changes " + ", ".join(line[3:] for line in changes[:8])
            + (f" and {len(changes) - 8} more" if len(changes) > 8 else ""))
    raise SystemExit(f"benchmarks: refusing to run on a work tree with uncommitted changes: "
                     f"{what}. Commit them first, or pass --allow-dirty (the tables then say "
                     f"'measured on uncommitted changes').")


def _measure(name: str, sizes: dict[str, Any], dirty: bool) -> tuple[dict[str, Any], list[Table]]:
    """Run one section; its result carries the commit (and whether the tree was dirty)."""
    before = commit()
    result, tables = _section(name, sizes)
    after = commit()
    # the tree may change under a long run (other people commit): say so
    result["commit"] = before if before == after else f"{before} -> {after}"
    result["dirty"] = dirty or bool(uncommitted())
    result["tables"] = [t.as_dict() for t in tables]
    return result, tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes (< 1 minute); write into a temporary directory only")
    parser.add_argument("--only", default="",
                        help=f"comma-separated sections to run ({', '.join(SECTIONS)})")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for results.json, tables.md and img/ (default: "
                             "benchmarks/results/ and docs/img/ in full mode, a temporary "
                             "one in smoke)")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: write the tables and plots from the saved results")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run on a work tree with uncommitted changes; the tables' header "
                             "then says 'measured on uncommitted changes'")
    parser.add_argument("--compare", metavar="REF", default=None,
                        help="the claim path (benchmarks/claimpath.py) on this tree and on "
                             "REF (a commit) back to back, and their ratios; writes nothing "
                             "but --out's JSON")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of --compare (each runs both trees once)")
    args = parser.parse_args(argv)
    if args.compare is not None:
        _check_services()
        cp_args = ["--entries", "300", "--chunk", "100", "--reps", "5"] if args.smoke else []
        for table in compare.compare(args.compare, args.rounds, cp_args,
                                     args.out / "compare.json" if args.out else None):
            print("\n" + table.text(), flush=True)
        return 0

    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    dirty = _refuse_dirty(args.allow_dirty)
    sizes = SMOKE if args.smoke else FULL
    if args.out is not None or args.smoke:
        out_dir = args.out or Path(tempfile.mkdtemp(prefix="elbench-smoke-"))
        results_path, tables_path, img = (out_dir / "results.json", out_dir / "tables.md",
                                          out_dir / "img")
    else:
        results = ROOT / "benchmarks" / "results"
        results_path, tables_path, img = (results / "full.json", results / "tables.md",
                                          ROOT / "docs" / "img")

    saved: dict[str, Any] = {}
    if results_path.exists() and (args.report_only or set(only) != set(SECTIONS)):
        saved = json.loads(results_path.read_text())
    if not args.report_only:
        _check_services()
        cleanup_leftovers()
        started = time.time()
        mode = "smoke" if args.smoke else "full"
        # re-running some sections into an earlier run keeps that run's machine and duration
        merging = bool(saved.get("sections")) and saved.get("mode") == mode
        info = machine()
        saved.setdefault("sections", {})
        if not merging:
            saved["machine"] = info
            saved["mode"] = mode
            saved["sizes"] = {k: sizes[k] for k in SECTIONS}
            saved.pop("reruns", None)
        else:
            saved.setdefault("sizes", {}).update({k: sizes[k] for k in only})
        print(f"benchmarks ({mode} mode"
              + (f", {report.DIRTY}" if dirty else "") + "): "
              + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
        for name in only:
            t0 = time.time()
            print(f"\n### {name}", flush=True)
            result, tables = _measure(name, sizes[name], dirty)
            result["seconds"] = time.time() - t0
            saved["sections"][name] = result
            for table in tables:
                print("\n" + table.text(), flush=True)
            print(f"({name}: {result['seconds']:.1f}s)", flush=True)
        if merging:
            saved.setdefault("reruns", []).append(
                {"sections": only, "date": info["date"], "commit": info.get("commit"),
                 "seconds": time.time() - started})
        else:
            saved["seconds"] = time.time() - started
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(saved, indent=1, default=str))
        cleanup_leftovers()
    if not saved.get("sections"):
        print("benchmarks: no results to report", file=sys.stderr)
        return 1
    plots = report.plots(saved, img)
    report.write(saved, tables_path)
    print(f"\nresults: {results_path}\ntables: {tables_path}\nplots: "
          + ", ".join(str(p) for p in plots), flush=True)
    if not args.report_only:
        print(f"total: {saved['seconds']:.1f}s", flush=True)
    return 0
