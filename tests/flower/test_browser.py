"""Headless Chromium (Debian's chromium + chromedriver, driven by selenium) loads the
/elarion page of the Flower with url_prefix and basic_auth and checks the rendered rows:
state badges, runtimes, lateness, workers and each job's sparkline.

With ``ELARION_FLOWER_SCREENSHOT=docs/img/flower-elarion.png`` the test saves its
screenshot of the page there (the one in docs/flower.md)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from celery_elarion_beat.flower.templates import STATE_BADGES
from tests.flower.cluster import NODES, Cluster
from tests.flower.support import (
    PROBE_JOB,
    chromium,
    duration_text,
    get_json,
    send_events,
    send_probe,
    send_probe_states,
)
from tests.helpers.processes import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# the package's Flower cluster is built once, on one worker; and Chromium
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("flower-cluster")]


_ROWS_JS = """
return Array.from(document.querySelectorAll('tr.elarion-occurrence')).map(function (r) {
  var link = r.querySelector('a.elarion-task');
  return {job: r.closest('.elarion-job').dataset.job, occurrence: r.dataset.occurrence,
          when: r.querySelector('.elarion-when').textContent,
          winner: r.querySelector('.elarion-winner').textContent,
          state: r.dataset.state,
          badge: r.querySelector('.elarion-state .badge').textContent,
          badgeClass: r.querySelector('.elarion-state .badge').className,
          exception: (r.querySelector('.elarion-exception') || {}).textContent || null,
          worker: r.querySelector('.elarion-worker').textContent,
          lateness: r.querySelector('.elarion-lateness').textContent,
          runtime: r.querySelector('.elarion-runtime').textContent,
          href: link ? link.getAttribute('href') : null,
          skips: Array.from(r.querySelectorAll('.elarion-skip')).map(function (b) {
            return b.textContent; })};
});
"""
_SPARKS_JS = """
return Array.from(document.querySelectorAll('.elarion-job')).map(function (card) {
  var chart = card.querySelector('svg.elarion-spark');
  var line = chart && chart.querySelector('polyline');
  return [card.dataset.job, chart ? parseInt(chart.dataset.points, 10) : 0,
          line ? line.getAttribute('points').split(' ').length : 0,
          chart ? chart.querySelector('title').textContent : null,
          card.querySelectorAll('circle.elarion-spark-failed').length];
});
"""
_NODES_JS = """
return Array.from(document.querySelectorAll('tr.elarion-node')).map(function (r) {
  return [r.dataset.node, r.querySelector('.elarion-node-dispatched').textContent,
          r.querySelector('.elarion-node-skipped').textContent];
});
"""


_FOREIGN_JS = """
var card = document.getElementById('elarion-foreign');
if (card.hidden) { return null; }
return Array.from(card.querySelectorAll('tr.elarion-foreign-sender')).map(function (r) {
  var c = r.querySelectorAll('td');
  return [c[0].textContent, c[1].textContent, c[2].textContent, c[3].textContent,
          c[4].textContent, c[5].textContent];
});
"""


def test_headless_chromium_renders_the_page(cluster: Cluster, tmp_path: Path) -> None:
    base, auth = cluster.guarded, cluster.auth
    state = get_json(base + "/elarion/api/state", auth)
    known = set(get_json(base + "/api/tasks", auth))
    driver = chromium(tmp_path / "profile")
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                               {"headers": {"Authorization": auth}})
        driver.get(base + "/elarion")
        wait_until(lambda: driver.execute_script(_ROWS_JS), 30,
                   message="rendered occurrence rows")
        wait_until(lambda: "Live · updated" in driver.find_element(
            "id", "elarion-status").text, 30, message="a successful poll of the JSON")
        rows = driver.execute_script(_ROWS_JS)
        expected = [(job["job"], occ["occurrence"], occ["winner"] or "—",
                     f"/flower/task/{occ['task_id']}" if occ["task_id"] else None,
                     sorted(f"{s['node']} · {s['reason']}" for s in occ["skipped"]))
                    for job in state["jobs"] if job["job"] != PROBE_JOB
                    for occ in job["occurrences"]]
        shown = [(r["job"], r["occurrence"], r["winner"], r["href"], sorted(r["skips"]))
                 for r in rows if r["job"] != PROBE_JOB]
        assert shown == expected
        assert all(r["when"].endswith(" UTC") for r in rows)
        occurrences = [occ for job in state["jobs"] if job["job"] != PROBE_JOB
                       for occ in job["occurrences"]]
        shown_runs = [(r["state"], r["badge"], r["exception"], r["worker"], r["lateness"],
                       r["runtime"]) for r in rows if r["job"] != PROBE_JOB]
        assert shown_runs == [
            (o["state"], o["state"], o["exception"], o["worker"] or "—",
             duration_text(o["lateness"]), duration_text(o["runtime"])) for o in occurrences]
        colours = {r["state"]: r["badgeClass"] for r in rows}
        assert {"succeeded", "failed", "skipped"} <= set(colours), colours
        assert "text-bg-success" in colours["succeeded"] and \
            "text-bg-danger" in colours["failed"], colours
        assert any(r["runtime"].endswith("ms") for r in rows), "no runtime on the page"
        assert any(r["lateness"].endswith("s")
                   for r in rows), "no lateness on the page"
        sparks = {job: rest for job, *rest in driver.execute_script(_SPARKS_JS)}
        for job in state["jobs"]:
            if job["job"] != PROBE_JOB:
                points, drawn, title, failed = sparks[job["job"]]
                assert points == drawn == len(job["runtimes"]) > 1, (job["job"], sparks)
                assert title.endswith(", ".join(map(duration_text, job["runtimes"]))), title
                assert failed == job["runtime_states"].count("failed"), (job, sparks)
        assert sum(s[3] for s in sparks.values()) > 0, "no failed run marked on a sparkline"
        nodes = {n: (int(d), int(s)) for n, d, s in driver.execute_script(_NODES_JS)}
        for node in NODES:
            assert nodes[node] == (
                sum(v for (_, nd, o, _), v in cluster.expected.items()
                    if nd == node and o == "dispatched"),
                sum(v for (_, nd, o, _), v in cluster.expected.items()
                    if nd == node and o == "skipped")), nodes
        assert driver.find_element("css selector", ".app-nav .nav-link.active").text == "Beat"

        driver.set_window_size(1400, 1900)
        driver.execute_script("window.scrollTo(0, 0);")
        shot = tmp_path / "flower-elarion.png"
        driver.save_screenshot(str(shot))
        if os.environ.get("ELARION_FLOWER_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["ELARION_FLOWER_SCREENSHOT"])

        # live: a new event shows up without a reload
        send_probe(cluster.env)
        wait_until(lambda: any(r["job"] == PROBE_JOB for r in driver.execute_script(_ROWS_JS)),
                   20, message="the page to show a new event without a reload")

        # the states the cluster does not reach, from events sent through the broker
        want = send_probe_states(cluster.env)

        def probe_rows() -> dict[str, tuple[str, str, str, str | None]] | None:
            found = {r["occurrence"]: (r["state"], r["lateness"], r["runtime"], r["exception"])
                     for r in driver.execute_script(_ROWS_JS) if r["occurrence"] in want}
            return found if found == want else None

        wait_until(probe_rows, 20, message=lambda: f"the probe's states {want}")
        for r in driver.execute_script(_ROWS_JS):
            assert r["badge"] == r["state"], r
            assert set(STATE_BADGES[r["state"]].split()) <= set(r["badgeClass"].split()), r

        # a beat that claims nothing: hidden until a worker reports one, then its own card
        assert driver.execute_script(_FOREIGN_JS) is None
        send_events(cluster.env, "worker@probe", [("elarion-foreign-beat", {
            "origin": "gen4242@web-3", "host": "web-3", "task_name": "proj.tasks.report",
            "entry": "nightly", "count": 3, "worker": "celery@w1"})])
        foreign = wait_until(lambda: driver.execute_script(_FOREIGN_JS), 20,
                             message="the card of a beat that claims nothing")
        (sender,) = foreign
        assert sender[:4] + sender[5:] == ["gen4242@web-3", "web-3",
                                           "proj.tasks.report (nightly) × 3", "3",
                                           "celery@w1"], foreign
        assert re.fullmatch(r"\d+s ago", sender[4]), foreign

        # a task link opens Flower's own task page (the worker ran it with -E)
        linked = [r["href"] for r in rows if r["href"] and r["href"].rsplit("/", 1)[1] in known]
        assert linked, f"no task on the page is known to Flower: {known}"
        driver.execute_script(  # one step: the page re-renders its rows every poll
            "document.querySelector('a.elarion-task[href=\"' + arguments[0] + '\"]').click();",
            linked[0])
        wait_until(lambda: driver.current_url.endswith(linked[0]), 20, message="task page")
        wait_until(lambda: linked[0].rsplit("/", 1)[1] in driver.page_source, 20,
                   message="Flower's task page")
        assert "Unknown task" not in driver.page_source
    finally:
        driver.quit()
