"""What the demo reads back (beat logs, results, claims) and the final table.

The beats log JSON lines (``elarion_beat_log_format = "json"``): their decisions
are read from the records' fields (``action``, ``job``, ``occurrence``, ``reason``,
``winner``), never from the text of a line.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ..observe.logformat import read_json_log
from .app import NODES

# -- what the demo reads back ---------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One beat log record: a node sent or skipped an occurrence."""

    node: str
    job: str
    occurrence: str | None  # iso, as in the claims table; None for every-node sends
    sent: bool
    reason: str | None = None
    winner: str | None = None


def parse_beat_log(node: str, text: str) -> list[Decision]:
    """The decisions of *node*'s beat, from the JSON records of its log.

    Lines that are not JSON records (Celery's banner, text lines) are skipped. A
    ``publish-error`` turns the send just before it into a skip: the message never
    left. A skip without an occurrence (an interval window whose claim failed) is
    filed under the second it was logged.
    """
    out: list[Decision] = []
    for record in read_json_log(text):
        action = record.get("action")
        if action not in ("dispatched", "skipped", "invalid-entry", "publish-error"):
            continue
        job = str(record["job"])
        occurrence = record.get("occurrence")
        if action == "dispatched":
            out.append(Decision(node, job, occurrence, True))
            continue
        if action == "publish-error":
            lost = Decision(node, job, occurrence, True)
            if lost in out:
                out.remove(lost)
        reason = record.get("reason") or str(action)
        out.append(Decision(node, job, occurrence or _logged_second(record), False, reason,
                            record.get("winner")))
    return out


def _logged_second(record: Mapping[str, Any]) -> str:
    """The record's ``ts`` to the second, as occurrences are written."""
    return str(record["ts"])[:19] + "Z"


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every execution the workers recorded (read once they have stopped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    runs = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                runs.append(json.loads(line))
            except ValueError:
                raise RuntimeError(f"{path}, line {number}, is not a result: {line[:80]!r}") \
                    from None
    return runs


@dataclass
class Row:
    """One cluster occurrence: who won, who skipped, where it ran."""

    job: str
    occurrence: str
    kind: str = "-"
    winner: str | None = None       # from the claims table
    senders: list[str] = field(default_factory=list)    # from the beat logs
    skipped_by: list[str] = field(default_factory=list)  # from the beat logs
    reasons: list[str] = field(default_factory=list)     # skip reason per skipped_by
    ran_on: list[str] = field(default_factory=list)      # from the results file


@dataclass
class Verdict:
    rows: list[Row]
    every_node: dict[str, Counter[str]]   # sending node -> executing nodes
    every_node_sent: Counter[str]
    duplicates: int
    problems: list[str]               # a broken guarantee: the demo exits 1
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.__dict__ for r in self.rows],
            "every_node": {k: dict(v) for k, v in self.every_node.items()},
            "every_node_sent": dict(self.every_node_sent),
            "duplicates": self.duplicates,
            "problems": self.problems,
            "notes": self.notes,
            "ok": self.ok,
        }


def iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_verdict(claims: Iterable[Any], decisions: Iterable[Decision],
                  runs: Iterable[Mapping[str, Any]], nodes: Iterable[str] = NODES) -> Verdict:
    """Join the claims table, the beat logs and the executions by (job, occurrence)."""
    decisions = list(decisions)
    rows: dict[tuple[str, str], Row] = {}

    def row(job: str, occurrence: str) -> Row:
        return rows.setdefault((job, occurrence), Row(job, occurrence))

    for claim in claims:
        r = row(claim.job, iso(claim.occurrence))
        r.kind, r.winner = claim.kind, claim.node
    every_sent: Counter[str] = Counter()
    for d in decisions:
        if d.sent and d.occurrence is None:
            every_sent[d.node] += 1
            continue
        r = row(d.job, d.occurrence or "?")
        if d.sent:
            r.senders.append(d.node)
        else:
            r.skipped_by.append(d.node)
            r.reasons.append(d.reason or "?")
    every_node: dict[str, Counter[str]] = defaultdict(Counter)
    for run in runs:
        if run.get("placement") == "every_node":
            every_node[run.get("sent_by") or "?"][run.get("ran_on") or "?"] += 1
        else:
            row(run.get("job") or "?", run.get("occurrence") or "?").ran_on.append(
                run.get("ran_on") or "?")
    problems = []
    duplicates = 0
    for r in rows.values():
        extra = max(len(r.ran_on), len(r.senders)) - 1
        if extra > 0:
            duplicates += extra
            problems.append(f"{r.job} at {r.occurrence} was sent by {r.senders} and ran on "
                            f"{r.ran_on}")
        if r.senders and r.winner is not None and r.senders != [r.winner]:
            problems.append(f"{r.job} at {r.occurrence}: the claims table names {r.winner}, "
                            f"the logs name {r.senders}")
    for sender, where in every_node.items():
        strays = {node: n for node, n in where.items() if node != sender}
        if strays:
            problems.append(f"every-node messages sent by {sender} ran on {strays}")
    notes = []
    nodes = list(nodes)
    unread = [n for n in nodes if not any(d.node == n for d in decisions)]
    if unread:
        notes.append(f"no decisions in the beat logs of {', '.join(unread)} (beat logs them as "
                     'JSON records with elarion_beat_log_format = "json")')
    missing = [n for n in nodes if not every_node.get(n)]
    if missing:
        notes.append(f"the every-node job did not run on {', '.join(missing)} (a run shorter "
                     "than its 5 s period, or a node stopped before its slot)")
    errors = Counter(reason for r in rows.values() for reason in r.reasons
                     if reason != "claimed-elsewhere")
    if errors:
        notes.append(f"skips other than claimed-elsewhere: {dict(errors)} (see the beat logs)")
    ordered = sorted(rows.values(), key=lambda r: (r.occurrence, r.job))
    return Verdict(ordered, dict(every_node), every_sent, duplicates, problems, notes)


def print_verdict(verdict: Verdict, out: TextIO, nodes: Iterable[str] = NODES) -> None:
    nodes = list(nodes)
    print("\nper occurrence (claims table + beat logs + the workers' results):\n", file=out)
    header = f"{'job':<18} {'occurrence':<21} {'claim':<6} {'winner':<7} " \
             f"{'skipped by':<16} {'ran on':<7} runs"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in verdict.rows:
        skipped = sorted(node if why == "claimed-elsewhere" else f"{node} ({why})"
                         for node, why in zip(r.skipped_by, r.reasons))
        print(f"{r.job:<18} {r.occurrence:<21} {r.kind:<6} {r.winner or '-':<7} "
              f"{', '.join(skipped) or '-':<16} "
              f"{', '.join(r.ran_on) or '-':<7} {len(r.ran_on)}", file=out)
    won = Counter(r.winner for r in verdict.rows if r.winner)
    print("\nper node:\n", file=out)
    print(f"{'node':<8} {'won':>4} {'skipped':>8} {'every-node sent':>16} "
          f"{'every-node ran here':>20}", file=out)
    for node in nodes:
        skips = sum(node in r.skipped_by for r in verdict.rows)
        ran_here = verdict.every_node.get(node, Counter()).get(node, 0)
        print(f"{node:<8} {won[node]:>4} {skips:>8} {verdict.every_node_sent[node]:>16} "
              f"{ran_here:>20}", file=out)
    slots = [r for r in verdict.rows if r.kind == "slot"]
    windows = [r for r in verdict.rows if r.kind == "window"]
    print(f"\ncluster occurrences: {len(verdict.rows)} (exact slots: {len(slots)}, "
          f"interval windows: {len(windows)}), executions: "
          f"{sum(len(r.ran_on) for r in verdict.rows)}", file=out)
    runs = {n: sum(c.values()) for n, c in sorted(verdict.every_node.items())}
    print(f"every-node runs per node: {runs}", file=out)
    for note in verdict.notes:
        print(f"note: {note}", file=out)
    for problem in verdict.problems:
        print(f"PROBLEM: {problem}", file=out)
    print(f"duplicates: {verdict.duplicates}", file=out, flush=True)


# -- the processes ---------------------------------------------------------------
