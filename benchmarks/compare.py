"""``python -m benchmarks --compare REF``: the claim path on this tree and on REF, back to back.

REF (a commit, a branch, a tag) is checked out into a temporary git worktree; the
measurement of :mod:`.claimpath` (this tree's file) runs in a fresh process per round,
importing the package of REF (``PYTHONPATH``), then of this tree, alternating
(REF, tree, tree, REF, ...) so that a machine that gets busier or quieter during the
run weighs on both alike. Printed: each figure's median over the rounds for both
trees, and their ratio (this tree / REF): a slower claim path shows as a ratio above
1 in the change that makes it. JSON of every round goes to ``--out`` when given.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import ROOT, Table

#: figure -> what it is (seconds, lower is better)
FIGURES = {"chunk_p50": "claim of a chunk, p50", "chunk_p99": "claim of a chunk, p99",
           "tick_events_on": "tick of all due entries, events on",
           "tick_events_off": "tick of all due entries, events off",
           "floor": "Celery's send_task loop (the floor)", "idle_tick": "a tick with nothing due"}


def _round(package_root: Path, out: Path, args: list[str]) -> dict[str, Any]:
    # run as a script, from elsewhere: neither the working directory nor this tree may
    # come before the package under test on sys.path
    env = {**os.environ, "PYTHONPATH": str(package_root), "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "claimpath.py"), "--out",
                    str(out), *args], cwd=out.parent, env=env, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    expected = package_root / "celery_elarion_beat"
    if Path(result["package"]).resolve() != expected.resolve():
        raise SystemExit(f"benchmarks: the round meant for {expected} imported "
                         f"{result['package']}")
    return result


def compare(ref: str, rounds: int, args: list[str], out: Path | None = None) -> list[Table]:
    rev = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True,
                         text=True)
    if rev.returncode != 0:
        raise SystemExit(f"benchmarks: --compare {ref!r} is no commit of this repository "
                         f"({rev.stderr.strip()})")
    with tempfile.TemporaryDirectory(prefix="elbench-ref-") as tmp:
        worktree = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), ref], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            runs: dict[str, list[dict[str, Any]]] = {"ref": [], "tree": []}
            for r in range(rounds):
                order = ("ref", "tree") if r % 2 == 0 else ("tree", "ref")
                for which in order:
                    root = worktree if which == "ref" else ROOT
                    runs[which].append(_round(root, Path(tmp) / f"{which}-{r}.json", args))
                    print(f"  round {r + 1}/{rounds}: {which} done", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT,
                           capture_output=True)
    if out is not None:
        out.write_text(json.dumps({"ref": ref, "rev": rev.stdout.strip(), "runs": runs},
                                  indent=1))
    rows = []
    for key, label in FIGURES.items():
        a = statistics.median(run[key] for run in runs["ref"])
        b = statistics.median(run[key] for run in runs["tree"])
        rows.append([label, f"{a * 1000:.2f}", f"{b * 1000:.2f}", f"{b / a:.3f}"])
    for which in ("ref", "tree"):
        ratios = [run["tick_events_on"] / run["floor"] for run in runs[which]]
        rows.append([f"events on / send_task loop ({which})", "", "",
                     f"{statistics.median(ratios):.3f}"])
    entries = runs["tree"][0]["entries"]
    return [Table(f"Claim path: this tree vs {ref} ({rev.stdout.strip()}), {rounds} rounds, "
                  f"{entries} due entries, medians in ms",
                  ["figure", f"{ref}", "this tree", "ratio (tree / ref)"], rows)]
