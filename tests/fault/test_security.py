"""Security: no credential on any surface, no task argument in any event, no script from
a job name on the Flower page.

One real run (module fixture) of :mod:`tests.fault.proj_security`: ``celery beat -l
DEBUG``, a worker that records its runs (``install_worker``), a real Flower with the
project's page (``examples/flowerconfig.py``), the exporter, an event receiver, and
every ``elarion-beat`` command that reads or writes the store (``init-db``, ``pause``,
``resume``, ``trigger``, ``status``, ``claims``, ``audit``, ``catch-up``, ``purge``).
The claims DSN carries a password in the URL *and* a ``?password=`` query parameter
(PostgreSQL's trust authentication accepts any), the broker URL a Redis password (a
Redis without ``requirepass`` accepts it: redis-py sends ``AUTH`` and goes on).

* :func:`test_no_credential_on_any_surface` greps beat's banner and every debug
  line, the worker's log, every event, every command's output, Flower's log, its
  ``/elarion`` page, JSON APIs and ``/metrics``, and the exporter's log and
  ``/metrics`` for each secret; each surface must also show the job, so the test
  cannot pass on silence. A second beat and ``status`` run with the DSN in libpq's
  key/value form (``host=... password=...``): they must work (the banner shows the
  masked URL it becomes) without showing that password either.
* :func:`test_events_never_carry_task_arguments`: an entry's ``args``/``kwargs``
  carry markers; the worker's runs file shows the task got them, no event (beat's,
  the worker's ``elarion-run``, the trigger's) nor the Flower page carries them. A
  second entry's task raises an error quoting its marker argument: its
  ``elarion-run`` event names the type (``ValueError``) only, the text stays in the
  claims table. (The worker runs without ``-E``: Celery's own ``task-*`` events carry
  the arguments by Celery's design, and are not this library's.)
* :func:`test_flower_page_shows_html_job_names_as_text_in_chromium`: jobs named
  ``<script>...`` and ``<img onerror=...>``, and a pause reason with markup, shown
  on the board, the Controls and the Audit cards of the page in headless Chromium:
  the literal text is on the page, no injected element exists, ``window.__pwned``
  stays undefined, no dialog opened. A positive control then inserts the same kind
  of markup as HTML and sees it run, so the probe can fail.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    wait_until,
)
from tests.fault import proj_security
from tests.fault.proj_security import (
    ARGS_JOB,
    FAIL_JOB,
    IMG_JOB,
    JOBS,
    MARKER_ARG,
    MARKER_KWARG,
    SCRIPT_JOB,
    TASK,
)
from tests.flower.support import (
    FLOWERCONFIG,
    EventCapture,
    chromium,
    delete_broker_keys,
    free_port,
    http_get,
)

pytestmark = [pytest.mark.postgres]
# a module scenario of two Flowers, an exporter, beats and Chromium
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("security")]

APP = "tests.fault.proj_security"
URL_SECRET = "PGURLSECRET1"      # postgresql://user:URL_SECRET@host/db
QUERY_SECRET = "PGQUERYSECRET2"  # ...?password=QUERY_SECRET
KV_SECRET = "PGKVSECRET3"        # host=... password=KV_SECRET (the libpq key/value form)
BROKER_SECRET = "REDISSECRET4"   # redis://:BROKER_SECRET@host:6379/0
SECRETS = (URL_SECRET, QUERY_SECRET, KV_SECRET, BROKER_SECRET)
#: in a pause reason: shown by the Controls and Audit cards
REASON = '<img src=x onerror="window.__pwned=3;alert(3)">'
#: generous: a loaded 2-core machine may take a minute to import celery and Flower
START_TIMEOUT = 120.0
RUNS_WANTED = 3
#: surfaces that have no reason to name a job (the others must, or they said nothing)
NO_JOB = frozenset({
    "elarion-beat init-db",
    "elarion-beat purge", "Flower log", "Flower log (store down)", "exporter log", "worker",
    "Flower /elarion/api/controls (store down)"})


@dataclass
class Scenario:
    env: dict[str, str]
    pm: ProcessManager
    flower: str
    exporter: str
    capture: EventCapture
    runs_file: Path
    #: surface -> what it showed (logs, command outputs, pages), filled by the run
    outputs: dict[str, str] = field(default_factory=dict)
    commands: dict[str, ChildProcess] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    raw_events: list[dict[str, Any]] = field(default_factory=list)

    def runs(self) -> list[dict[str, Any]]:
        if not self.runs_file.exists():
            return []
        return [json.loads(line) for line in self.runs_file.read_text().splitlines() if line]


# -- DSNs ----------------------------------------------------------------------


def url_dsn(pg_dsn: str, port: int | None = None) -> str:
    """*pg_dsn* with a password in the URL and another one as ``?password=`` (and
    another *port*: a closed one for a store that is down)."""
    url = make_url(pg_dsn).set(password=URL_SECRET).update_query_dict(
        {"password": QUERY_SECRET})
    if port is not None:
        url = url.set(host="127.0.0.1", port=port)
    text = url.render_as_string(hide_password=False)
    assert URL_SECRET in text and QUERY_SECRET in text, text
    return text


def keyvalue_dsn(pg_dsn: str) -> str:
    """*pg_dsn* in libpq's key/value form, with a password."""
    url = make_url(pg_dsn)
    return (f"host={url.host or '127.0.0.1'} port={url.port or 5432} "
            f"user={url.username or 'postgres'} password={KV_SECRET} dbname={url.database}")


def broker_with_secret(redis_url: str) -> str:
    parts = urlsplit(redis_url)
    netloc = f":{BROKER_SECRET}@{parts.hostname}:{parts.port or 6379}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/0", "", ""))


# -- processes -------------------------------------------------------------------


def run_commands(s: Scenario, specs: dict[str, list[str]],
                 env: dict[str, str] | None = None) -> None:
    """Run ``elarion-beat <args>`` for each name -> args at once, each to its end."""
    started = {name: s.pm.celery("cli-" + re.sub(r"\W+", "-", name).strip("-"),
                                 ["elarion-beat", *args], env=env)
               for name, args in specs.items()}
    for name, process in started.items():
        assert process.wait(START_TIMEOUT) is not None, f"{name} did not finish\n" + \
            process.tail()
        s.commands[name] = process


def wait_for_runs(s: Scenario, beat: ChildProcess) -> None:
    def enough() -> bool:
        ran = [r for r in s.runs() if r["job"] == ARGS_JOB]
        seen = {e.get("job") for e in s.capture.snapshot()
                if e.get("type") == "elarion-dispatched"}
        runs = {(e.get("job"), e.get("state")) for e in s.capture.snapshot()
                if e.get("type") == "elarion-run"}
        return len(ran) >= RUNS_WANTED and set(JOBS) <= seen and \
            {(ARGS_JOB, "succeeded"), (FAIL_JOB, "failed")} <= runs

    wait_until(enough, START_TIMEOUT, interval=0.5, message=lambda: f"{RUNS_WANTED} runs "
               f"of {ARGS_JOB}, every job dispatched, elarion-run events\n{s.pm.tails(15)}")
    assert beat.alive(), beat.tail()


def flower_pages(s: Scenario) -> dict[str, str]:
    """Flower's elarion page, its JSON APIs and /metrics ("" while one does not answer)."""
    out = {}
    for path in ("/elarion", "/elarion/api/state", "/elarion/api/controls", "/metrics"):
        status, body = http_get(s.flower + path)
        out[f"Flower {path}"] = body if status == 200 else ""
    status, body = http_get(s.exporter)
    out["exporter /metrics"] = body if status == 200 else ""
    return out


def wait_for_monitors(s: Scenario) -> dict[str, str]:
    """Until Flower's board, its controls and both /metrics show every job (and the
    audit the commands wrote), then their text."""
    def shown() -> dict[str, str] | None:
        pages = flower_pages(s)
        state = pages["Flower /elarion/api/state"]
        if not state:
            return None
        board = {j["job"] for j in json.loads(state)["jobs"]}
        controls = pages["Flower /elarion/api/controls"]
        audited = controls and {a["job"] for a in json.loads(controls)["audit"]}
        metrics = all(f'job="{ARGS_JOB}"' in pages[k]
                      for k in ("Flower /metrics", "exporter /metrics"))
        return pages if set(JOBS) <= board and audited and SCRIPT_JOB in audited \
            and metrics else None

    return wait_until(shown, 60, interval=1.0, message=lambda: "Flower and the exporter "
                      f"to show every job\n{s.pm.tails(15)}")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
             redis_url: str) -> Iterator[Scenario]:
    run = uuid.uuid4().hex[:10]
    table = f"sec_{run}"
    workdir = tmp_path_factory.mktemp("security")
    env = {"ELARION_SEC_BROKER": broker_with_secret(redis_url), "ELARION_SEC_RUN": run,
           "ELARION_SEC_DSN": url_dsn(pg_dsn), "ELARION_SEC_TABLE": table,
           "ELARION_SEC_NODE": f"sec-{run}", "ELARION_SEC_RUNS": str(workdir / "runs.jsonl")}
    pm = ProcessManager(workdir / "procs", APP, env)
    ports = free_port(), free_port(), free_port()
    capture = EventCapture(env, app=proj_security.make_app(env)).start()
    s = Scenario(env, pm, f"http://127.0.0.1:{ports[0]}",
                 f"http://127.0.0.1:{ports[1]}/metrics", capture, workdir / "runs.jsonl")
    try:
        run_commands(s, {"init-db": ["init-db"]})
        worker = pm.worker("worker")
        flower = pm.celery("flower", ["flower", f"--conf={FLOWERCONFIG}", f"--port={ports[0]}",
                                      "--address=127.0.0.1"],
                           env={"FLOWER_UNAUTHENTICATED_API": "1"})
        down = {"ELARION_SEC_DSN": url_dsn(pg_dsn, port=1)}
        flower_down = pm.celery("flower-store-down", [
            "flower", f"--conf={FLOWERCONFIG}", f"--port={ports[2]}", "--address=127.0.0.1"],
            env={"FLOWER_UNAUTHENTICATED_API": "1", **down})
        exporter = pm.celery("exporter", ["elarion-beat", "exporter", "--port",
                                          str(ports[1]), "--address", "127.0.0.1"])
        worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        beat = pm.beat("beat", loglevel="DEBUG")
        beat.wait_for_log(r"beat: claiming occurrences in .* as node ", START_TIMEOUT)
        wait_for_runs(s, beat)
        # the operators' commands: audit rows (with markup) for the page, a run by hand
        run_commands(s, {
            "pause": ["pause", IMG_JOB, "--for", "1h", "--reason", REASON],
            "pause (script)": ["pause", SCRIPT_JOB, "--reason", REASON],
            "trigger": ["trigger", ARGS_JOB, "--reason", "security"]})
        run_commands(s, {"resume": ["resume", SCRIPT_JOB]})
        kv = {"ELARION_SEC_DSN": keyvalue_dsn(pg_dsn), "ELARION_SEC_NODE": f"sec-kv-{run}"}
        kv_beat = pm.beat("beat-keyvalue", loglevel="DEBUG", env=kv)
        run_commands(s, {"status": ["status", "--since", "10m"], "status --json": [
            "status", "--json"], "claims": ["claims"], "claims --json": ["claims", "--json"],
            "claims --job (failing)": ["claims", "--job", FAIL_JOB, "--json"],
            "audit": ["audit"], "audit --json": ["audit", "--json"],
            "catch-up": ["catch-up", "--dry-run"], "purge": ["purge", "--dry-run"]})
        run_commands(s, {"status (key/value DSN)": ["status"]}, env=kv)
        kv_beat.wait_for_log(r"beat: (Sending due task|Skipping) ", START_TIMEOUT)
        kv_beat.terminate()
        pages = wait_for_monitors(s)
        pages["Flower /elarion/api/controls (store down)"] = wait_until(
            lambda: http_get(f"http://127.0.0.1:{ports[2]}/elarion/api/controls")[1], 60,
            message=lambda: f"the Flower whose store is down to answer\n{flower_down.tail()}")
        beat.terminate()
        worker.terminate()
        s.raw_events = capture.raw()
        s.events = capture.snapshot()
        s.outputs = {"beat (banner, debug log)": beat.log(), "worker": worker.log(),
                     "beat (key/value DSN)": kv_beat.log(), "Flower log": flower.log(),
                     "exporter log": exporter.log(),
                     "Flower log (store down)": flower_down.log(),
                     **{f"elarion-beat {n}": p.log() for n, p in s.commands.items()},
                     **pages,
                     "events": "\n".join(json.dumps(e, default=str) for e in s.raw_events)}
        (workdir / "surfaces.json").write_text(json.dumps(s.outputs, indent=1))
        yield s
    finally:
        capture.stop()
        pm.stop_all()
        names = Settings.from_mapping({"elarion_beat_table": table})
        drop_tables(pg_dsn, names.nodes_table, *claims_tables(table), names.pauses_table,
                    names.audit_table)
        delete_broker_keys(redis_url, run)


# -- 1. credentials --------------------------------------------------------------


def test_no_credential_on_any_surface(scenario: Scenario) -> None:
    s = scenario
    leaks = [f"{where}: {line.strip()[:200]}" for where, text in s.outputs.items()
             for line in text.splitlines() for secret in SECRETS if secret in line]
    assert not leaks, f"a credential was shown in clear on {len(leaks)} lines:\n" + \
        "\n".join(leaks[:30])

    # every surface said something, and about this run (so silence cannot pass)
    empty = [where for where, text in s.outputs.items() if not text.strip()]
    assert not empty, f"surfaces with nothing to grep: {empty}"
    about_job = {where: text for where, text in s.outputs.items() if where not in NO_JOB}
    silent = [where for where, text in about_job.items()
              if not any(job in text for job in (*JOBS, FAIL_JOB))]
    assert not silent, f"surfaces that do not show the jobs: {silent}"
    beat = s.outputs["beat (banner, debug log)"]
    assert "postgresql+psycopg://postgres:***@" in beat and "password=***" in beat, beat[:3000]
    assert "redis://:**@" in beat, "the banner does not name the (masked) broker"
    assert "DEBUG/MainProcess]" in beat, "beat did not log at debug level"
    assert TASK in s.outputs["worker"] and "succeeded" in s.outputs["worker"]
    assert "would delete" in s.outputs["elarion-beat purge"].lower() or \
        any(ch.isdigit() for ch in s.outputs["elarion-beat purge"]), s.outputs[
            "elarion-beat purge"]
    # status exits 1 on findings (a paused job, the slots of a new table): not a failure
    failed = {n: p.returncode for n, p in s.commands.items()
              if p.returncode not in ((0, 1) if n.startswith("status") else (0,))}
    assert not failed, failed

    # the libpq key/value form works: beat shows the masked URL it became, and claims
    kv_beat = s.outputs["beat (key/value DSN)"]
    assert "postgresql+psycopg://postgres:***@" in kv_beat, kv_beat[:3000]
    assert "beat: claiming occurrences in " in kv_beat, kv_beat[-2000:]
    # a store that is down: Flower's controls answer with the masked DSN
    down = json.loads(s.outputs["Flower /elarion/api/controls (store down)"])
    assert "postgresql+psycopg://postgres:***@127.0.0.1:1/test?password=***" in \
        down["error"], down


# -- 2. events never carry task arguments ----------------------------------------------


def test_events_never_carry_task_arguments(scenario: Scenario) -> None:
    s = scenario
    markers = (MARKER_ARG, MARKER_KWARG)
    # the arguments reached the task, on beat's runs and on the run by hand
    ran = [r for r in s.runs() if r["job"] == ARGS_JOB]
    assert len(ran) >= RUNS_WANTED, ran
    assert all(r["args"] == [MARKER_ARG] and r["kwargs"] == {"token": MARKER_KWARG}
               for r in ran), ran
    assert any(r["job"] == FAIL_JOB and r["args"] == [MARKER_ARG] for r in s.runs())
    # every kind of event was seen: beat's, the worker's, the trigger's
    types = {e.get("type") for e in s.events}
    assert {"elarion-dispatched", "elarion-run"} <= types, types
    manual = [e for e in s.events if e.get("type") == "elarion-dispatched" and e.get("manual")]
    assert [e.get("job") for e in manual] == [ARGS_JOB], manual
    assert any(e.get("job") == ARGS_JOB and e.get("type") == "elarion-run" for e in s.events)
    # a failed run's event names the error's type; its text (which quotes the argument)
    # stays in the claims table, where `claims` shows it
    failed = [e for e in s.events if e.get("type") == "elarion-run" and e.get("job") == FAIL_JOB
              and e.get("state") == "failed"]
    assert failed and {e.get("exception") for e in failed} == {"ValueError"}, failed
    assert f"ValueError: refused '{MARKER_ARG}'" in s.outputs[
        "elarion-beat claims --job (failing)"]
    carrying = [json.dumps(e, default=str)[:300] for e in s.raw_events + s.events
                if any(m in json.dumps(e, default=str) for m in markers)]
    assert not carrying, f"{len(carrying)} events carry a task argument:\n" + \
        "\n".join(carrying[:10])
    pages = {k: v for k, v in s.outputs.items() if k.startswith(("Flower /", "exporter /"))}
    shown = [k for k, v in pages.items() if any(m in v for m in markers)]
    assert not shown, f"task arguments shown on {shown}"


# -- 4. the Flower page escapes job names (real browser) ---------------------------------

_ALERT_HOOK = """
window.__dialogs = [];
['alert', 'confirm', 'prompt'].forEach(function (name) {
  window[name] = function (m) { window.__dialogs.push(name + ':' + String(m)); return null; };
});
"""
_PAGE_JS = """
var root = document.getElementById('elarion');
return {
  cards: Array.from(document.querySelectorAll('.elarion-job')).map(function (c) {
    return [c.dataset.job, c.querySelector('.elarion-card-title span').textContent]; }),
  controls: Array.from(document.querySelectorAll('tr.elarion-control')).map(function (r) {
    return [r.dataset.job, r.dataset.paused, r.querySelector('strong').textContent,
            r.querySelector('.elarion-pause-cell').textContent]; }),
  audit: Array.from(document.querySelectorAll('tr.elarion-audit-row')).map(function (r) {
    return [r.dataset.action, r.querySelector('.elarion-audit-job').textContent,
            r.querySelector('.elarion-audit-details').textContent]; }),
  loaded: !!root.dataset.controlsLoaded,
  text: root.innerText,
  injected: document.querySelectorAll('img[src="x"], #elarion script').length,
  pwned: typeof window.__pwned === 'undefined' ? null : window.__pwned,
  dialogs: window.__dialogs || null
};
"""


def test_flower_page_shows_html_job_names_as_text_in_chromium(scenario: Scenario,
                                                              tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    driver = chromium(tmp_path / "profile")
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _ALERT_HOOK})
        driver.get(scenario.flower + "/elarion")

        def rendered() -> dict[str, Any] | None:
            page: dict[str, Any] = driver.execute_script(_PAGE_JS)
            cards = {job for job, _ in page["cards"]}
            audited = {job for _, job, _ in page["audit"]}
            return page if set(JOBS) <= cards and page["loaded"] and \
                SCRIPT_JOB in audited else None

        html = scenario.outputs["Flower /elarion"]
        assert SCRIPT_JOB not in html and "<\\/script>" in html, \
            "a job name closes the page's JSON <script> block"
        page = wait_until(rendered, 60, interval=0.5, message=lambda: "the board, controls "
                          f"and audit to show every job\n{driver.execute_script(_PAGE_JS)}")
        # shown as text, where the job is shown
        assert all(job == title for job, title in page["cards"]), page["cards"]
        controls = {job: rest for job, *rest in page["controls"]}
        assert controls[IMG_JOB][:2] == ["own", IMG_JOB], controls
        assert REASON in controls[IMG_JOB][2], controls[IMG_JOB]
        assert controls[SCRIPT_JOB][:2] == ["", SCRIPT_JOB], controls
        audit = {(action, job): details for action, job, details in page["audit"]}
        assert {("pause", IMG_JOB), ("pause", SCRIPT_JOB), ("resume", SCRIPT_JOB),
                ("trigger", ARGS_JOB)} <= set(audit), audit
        assert REASON in audit[("pause", IMG_JOB)], audit
        for literal in (SCRIPT_JOB, IMG_JOB, REASON):
            assert literal in page["text"], f"{literal!r} is not visible on the page"
        # and nothing ran
        assert page["injected"] == 0, "an element from a job name or reason is in the page"
        assert page["pwned"] is None, f"script from a job name ran: __pwned={page['pwned']}"
        assert page["dialogs"] == [], page["dialogs"]
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018 - raises when no dialog is open

        # positive control: the same markup inserted as HTML does run in this browser
        driver.execute_script("var d = document.createElement('div'); d.innerHTML = "
                              "arguments[0]; document.body.appendChild(d);", REASON)
        probe = wait_until(lambda: driver.execute_script(_PAGE_JS)["pwned"], 10,
                           message="the positive control's onerror to run")
        assert probe == 3 and driver.execute_script("return window.__dialogs") == ["alert:3"]
    finally:
        driver.quit()
