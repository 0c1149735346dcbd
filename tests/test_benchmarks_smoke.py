"""The benchmark suite still runs, and it never passes off uncommitted code as a commit.

``python -m benchmarks --smoke`` must exit 0, print its tables and write them,
the plots and the results JSON; the numbers are measurements (docs/benchmarks.md,
written by hand), never assertions. The smoke run needs PostgreSQL and Redis
(like the rest of the suite) and the benchmark packages (matplotlib,
celery-redbeat); it writes into a temporary directory, never into docs/.

On a work tree with uncommitted changes the command refuses to run unless given
``--allow-dirty``, and then the tables' header says so: checked against scratch
git checkouts (``GIT_DIR``/``GIT_WORK_TREE``), whatever the state of this one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from celery_elarion_beat.testing._harness import clean_env

ROOT = Path(__file__).resolve().parents[1]
DIRTY = "measured on uncommitted changes"

TABLES = (
    "== Overhead:",
    "== Floor: Celery's own publish",
    "== Throughput:",
    "== Throughput, per node",
    "== Scale-out:",
    "== Latency, due -> published:",
    "== Failover:",
    "== Scheduler CPU per due entry",
    "== Jitter: one slot",
    "== Jitter: messages per second",
    "== Jitter: one job's offset",
    "== Big schedules: start-up and memory",
    "== Big schedules: idle",
    "== Big schedules: ratio ClaimingScheduler / stock",
    "== Big schedules: where the CPU goes",
    "== Claims table: prefill",
    "== Claims table: claim latency per chunk",
    "== Claims table: purge at",
    "== Capacity: database cost per due entry",
    "== Capacity: claims per second",
    "== Capacity: worker run tracking",
    "== One-offs:",
    "== One-offs, per node",
    "== Live schedules: from a committed edit",
    "== Live schedules: 200 database entries",
)


@pytest.mark.postgres
@pytest.mark.acceptance  # real beat processes
@pytest.mark.slow  # about two minutes: CI's second step
@pytest.mark.timeout(300)
# it loads both cores for two minutes (sections run in parallel); and the benchmarks
# clean up every elbench table and key they find, so never beside another benchmark run
@pytest.mark.alone
@pytest.mark.xdist_group("elbench")
def test_the_benchmarks_run_in_smoke_mode(pg_dsn: str, redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    dirty = bool(_git(["status", "--porcelain"]).strip())
    done = _benchmarks(["--smoke", "--allow-dirty", "--out", str(out)], timeout=240,
                       env={"ELARION_BENCH_PG_DSN": pg_dsn, "ELARION_BENCH_REDIS_URL": redis_url})
    report = _report(done)
    assert done.returncode == 0, report
    missing = [title for title in TABLES if title not in done.stdout]
    assert not missing, f"tables not printed: {missing}\n{report}"
    tables = (out / "tables.md").read_text()
    header = tables.splitlines()[0]
    assert header.startswith("# Benchmark tables"), tables[:500]
    assert (DIRTY in header) == dirty, (dirty, header)
    written = [title for title in TABLES if f"**{title[3:]}" not in tables]
    assert not written, f"tables not written: {written}\n{tables[:2000]}"
    results = json.loads((out / "results.json").read_text())
    head = _git(["rev-parse", "--short", "HEAD"]).strip()
    for name, section in results["sections"].items():
        assert section["commit"] == head and section["dirty"] == dirty, (name, section["commit"])
    _check_bigschedule(results["sections"]["bigschedule"])
    _check_claimstable(results["sections"]["claimstable"], pg_dsn)
    _check_one_offs(results["sections"]["oneoffs"])
    assert "## 11. One-offs" in tables
    ticks = results["sections"]["capacity"]["ticks"]  # each due entry won once per round
    assert [t["duplicates_or_missing"] for t in ticks] == [0] * len(ticks), ticks
    plots = sorted(p.name for p in (out / "img").glob("*.png"))
    assert plots == ["bigschedule.png", "claimstable.png", "failover.png", "jitter.png",
                     "latency.png", "overhead.png", "scaleout_shares.png", "scaleout_time.png",
                     "throughput.png"], plots
    assert not list(out.glob("*benchmarks.md")), "the benchmark code wrote prose"


@pytest.mark.postgres
@pytest.mark.timeout(180)
# the benchmarks clean up every elbench table and key they find: never beside another
# benchmark run (the smoke run, the soak)
@pytest.mark.xdist_group("elbench")
def test_the_jitter_benchmark_runs_alone_and_checks_every_message(
        pg_dsn: str, redis_url: str, tmp_path: Path) -> None:
    """``--only jitter``: its tables and plot are written, and its own checks hold in
    the results (each job sent once, at its offset, claimed once, every node's record
    at the same step); no measured figure is asserted."""
    out = tmp_path / "bench"
    done = _benchmarks(["--smoke", "--only", "jitter", "--allow-dirty", "--out", str(out)],
                       timeout=150,
                       env={"ELARION_BENCH_PG_DSN": pg_dsn, "ELARION_BENCH_REDIS_URL": redis_url})
    report = _report(done)
    assert done.returncode == 0, report
    jitter_tables = [title for title in TABLES if title.startswith("== Jitter")]
    assert all(title in done.stdout for title in jitter_tables), report
    tables = (out / "tables.md").read_text()
    assert "## 7. Jitter" in tables, tables[:2000]
    assert [p.name for p in (out / "img").glob("*.png")] == ["jitter.png"]
    section = json.loads((out / "results.json").read_text())["sections"]["jitter"]
    for run in ("baseline", "jittered"):
        r = section[run]
        jobs = r["jobs"]
        checks = {key: r[key] for key in ("messages", "published_once", "at_offset", "claims",
                                          "claims_for_the_slot", "claims_by_sender",
                                          "records_agree", "dispatched_jitter_matches")}
        assert checks == dict.fromkeys(checks, jobs), (run, checks)
        assert r["duplicates"] == r["missing"] == r["still_held"] == 0, (run, r)
        assert all(node["jobs"] == node["records"] == jobs for node in r["per_node"].values()), \
            (run, r["per_node"])
        assert len(r["per_second"]) == 60 and sum(r["per_second"]) == jobs, run
    slots = section["hourly"]["slots"]
    assert [s["messages"] for s in slots] == [1] * len(slots), slots
    assert all(s["at_offset"] and s["held_after"] == 0 for s in slots), slots


def _check_one_offs(r: dict) -> None:
    """Every one-off was published and each message counted once; no measured figure."""
    n = r["one_offs"]
    assert r["states"] == {"published": n} and r["messages"] == n, r
    assert r["duplicates"] == r["missing"] == r["foreign"] == 0, r
    assert sum(node["one_offs"] for node in r["per_node"].values()) == n, r
    assert 0 < r["lease_statements"] <= n, r


def _check_bigschedule(section: dict) -> None:
    """Both schedulers ran every size in a process of their own, with the whole schedule,
    nothing sent while idle and the one-seconds entry sent. No measured figure."""
    runs = {(r["n"], r["kind"], r["variant"]): r for r in section["runs"]}
    expected = {(n, kind, "idle") for n in section["sizes"] for kind in ("stock", "elarion")}
    expected |= {(n, kind, "seconds") for n in section["seconds_sizes"]
                 for kind in ("stock", "elarion")}
    assert set(runs) == expected, sorted(runs)
    for (n, _, variant), r in runs.items():
        assert r["schedule_len"] == n and r["idle"]["ticks"] > 0, r
        if variant == "idle":
            assert r["published"] == 0 and r["tick_count"] > 0, r
        else:  # about one a second (stock beat wakes 10 ms early, so it may send one more)
            assert 1 <= r["published"] <= section["idle_seconds"] + 2, r
    assert [row["n"] for row in section["ratios"]] == section["sizes"]


def _check_claimstable(section: dict, pg_dsn: str) -> None:
    """Each layout at each size, every claim of every chunk won, the fill wrote exactly
    its rows, the purge removed rows (the partitioned one by dropping day partitions)
    and each run's scratch schema is gone. No measured figure."""
    assert section["skipped"] == []
    runs = {(r["layout"], r["rows"]): r for r in section["runs"]}
    assert set(runs) == {(layout, n) for layout in ("plain", "partitioned") for n in (0, 20_000)}
    chunk, chunks = section["chunk"], section["chunks"]
    for r in runs.values():
        c = r["claims"]
        assert len(c["ms"]) == chunks and c["won"] == c["requests"] == chunks * chunk, r
        assert c["cold_won"] == c["hot_won"] == chunk, r
    for layout in ("plain", "partitioned"):
        p = runs[(layout, 20_000)]["purge"]
        # the history, then a warm-up chunk, the timed chunks, the cold and the hot chunk
        assert p["rows_before"] == 20_000 + (chunks + 3) * chunk, p
        assert p["removed"] > 0 and p["returned"] == p["removed"], p
    plain, parted = runs[("plain", 20_000)]["purge"], runs[("partitioned", 20_000)]["purge"]
    assert plain["dropped"] == [] and plain["size_before"]["partitions"] == 0, plain
    assert parted["dropped"], parted
    assert (parted["size_after"]["partitions"]
            == parted["size_before"]["partitions"] - len(parted["dropped"])), parted
    with psycopg.connect(pg_dsn) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
                            ([r["schema"] for r in runs.values()],)).fetchall()
    assert left == [], left


def test_a_dirty_work_tree_is_refused_unless_allowed(tmp_path: Path) -> None:
    out = _saved_results(tmp_path / "out", dirty=False)
    tree = _scratch_checkout(tmp_path / "tree")
    (tree / "changed.py").write_text("x = 1\n")  # untracked: `git status --porcelain` lists it
    refused = _benchmarks(["--report-only", "--out", str(out)], git=tree)
    assert refused.returncode != 0, _report(refused)
    assert "uncommitted changes" in refused.stderr and "changed.py" in refused.stderr, \
        _report(refused)
    assert "--allow-dirty" in refused.stderr, _report(refused)
    assert not (out / "tables.md").exists()

    allowed = _benchmarks(["--report-only", "--allow-dirty", "--out", str(out)], git=tree)
    assert allowed.returncode == 0, _report(allowed)
    assert (out / "tables.md").read_text().startswith("# Benchmark tables\n")


def test_the_tables_header_says_when_a_section_was_measured_on_uncommitted_changes(
        tmp_path: Path) -> None:
    tree = _scratch_checkout(tmp_path / "tree")
    clean = _benchmarks(["--report-only", "--out", str(_saved_results(tmp_path / "a", False))],
                        git=tree)
    assert clean.returncode == 0, _report(clean)
    assert DIRTY not in (tmp_path / "a" / "tables.md").read_text()
    marked = _benchmarks(["--report-only", "--out", str(_saved_results(tmp_path / "b", True))],
                         git=tree)
    assert marked.returncode == 0, _report(marked)
    tables = (tmp_path / "b" / "tables.md").read_text()
    assert tables.splitlines()[0] == f"# Benchmark tables ({DIRTY})", tables[:300]
    assert f"Commit abc1234, {DIRTY}" in tables, tables


def _saved_results(out: Path, dirty: bool) -> Path:
    """A results file with one section (no plot) and one table."""
    out.mkdir(parents=True)
    table = {"title": "Scheduler CPU per due entry", "columns": ["schedule", "total us"],
             "rows": [["cron", 12.0]], "notes": []}
    results = {"mode": "smoke", "seconds": 1.0, "machine": {"nproc": "2"},
               "sections": {"percall": {"commit": "abc1234", "dirty": dirty, "seconds": 1.0,
                                        "tables": [table]}}}
    (out / "results.json").write_text(json.dumps(results))
    return out


def _scratch_checkout(tree: Path) -> Path:
    """A git work tree with one commit and nothing uncommitted."""
    tree.mkdir()
    (tree / "kept.py").write_text("x = 0\n")
    for args in (["init", "-q"], ["add", "kept.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one"]):
        subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)
    return tree


def _benchmarks(args: list[str], timeout: float = 120, env: dict[str, str] | None = None,
                git: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = dict(env or {})
    if git is not None:  # git answers for the scratch checkout, not for this repository
        extra.update(GIT_DIR=str(git / ".git"), GIT_WORK_TREE=str(git))
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**_env(), **extra})


def _git(args: list[str]) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def _report(done: subprocess.CompletedProcess[str]) -> str:
    return (f"rc {done.returncode}\n--- stdout ---\n{done.stdout[-6000:]}\n"
            f"--- stderr ---\n{done.stderr[-6000:]}")


def _env() -> dict[str, str]:
    return {k: v for k, v in clean_env().items() if not k.startswith("GIT_")}


@pytest.mark.postgres
@pytest.mark.slow  # two processes per round, each claiming and sending: CI's second step
@pytest.mark.timeout(300)
# the benchmarks clean up every elbench table and key they find: never beside another
# benchmark run (the smoke run, the soak)
@pytest.mark.xdist_group("elbench")
def test_compare_measures_this_tree_and_a_commit_and_prints_their_ratios(
        pg_dsn: str, redis_url: str, tmp_path: Path) -> None:
    """``--compare HEAD`` runs the claim path on a worktree of HEAD and on this tree,
    each importing its own package, and prints one ratio per figure; a ref that is no
    commit is refused by name."""
    env = {"ELARION_BENCH_PG_DSN": pg_dsn, "ELARION_BENCH_REDIS_URL": redis_url}
    done = _benchmarks(["--compare", "HEAD", "--smoke", "--rounds", "1", "--out",
                        str(tmp_path)], timeout=240, env=env)
    assert done.returncode == 0, _report(done)
    assert "ratio (tree / ref)" in done.stdout and "claim of a chunk, p50" in done.stdout, \
        _report(done)
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    packages = {which: [r["package"] for r in rounds] for which, rounds in runs.items()}
    assert packages["tree"] == [str(ROOT / "celery_elarion_beat")], packages
    assert all("elbench-ref-" in p for p in packages["ref"]), packages
    assert all(r["chunk_p50"] > 0 and r["floor"] > 0 for rounds in runs.values()
               for r in rounds), runs
    wrong = _benchmarks(["--compare", "no-such-ref-xyz"], env=env)
    assert wrong.returncode != 0 and "no-such-ref-xyz" in wrong.stderr, _report(wrong)
