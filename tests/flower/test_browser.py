"""Headless Chromium (Debian's chromium + chromedriver, driven by selenium) loads the
/elarion page of the Flower with url_prefix and basic_auth and checks the rendered rows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.flower.cluster import NODES, Cluster
from tests.flower.support import PROBE_JOB, chromium, get_json, send_probe
from tests.helpers.processes import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]


_ROWS_JS = """
return Array.from(document.querySelectorAll('tr.elarion-occurrence')).map(function (r) {
  var link = r.querySelector('a.elarion-task');
  return {job: r.closest('.elarion-job').dataset.job, occurrence: r.dataset.occurrence,
          when: r.querySelector('.elarion-when').textContent,
          winner: r.querySelector('.elarion-winner').textContent,
          href: link ? link.getAttribute('href') : null,
          skips: Array.from(r.querySelectorAll('.elarion-skip')).map(function (b) {
            return b.textContent; })};
});
"""
_NODES_JS = """
return Array.from(document.querySelectorAll('tr.elarion-node')).map(function (r) {
  return [r.dataset.node, r.querySelector('.elarion-node-dispatched').textContent,
          r.querySelector('.elarion-node-skipped').textContent];
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
        nodes = {n: (int(d), int(s)) for n, d, s in driver.execute_script(_NODES_JS)}
        for node in NODES:
            assert nodes[node] == (
                sum(v for (_, nd, o, _), v in cluster.expected.items()
                    if nd == node and o == "dispatched"),
                sum(v for (_, nd, o, _), v in cluster.expected.items()
                    if nd == node and o == "skipped")), nodes
        assert driver.find_element("css selector", ".app-nav .nav-link.active").text == "Beat"

        driver.set_window_size(1400, 1500)
        driver.execute_script("window.scrollTo(0, 0);")
        shot = tmp_path / "flower-elarion.png"
        driver.save_screenshot(str(shot))
        if os.environ.get("ELARION_FLOWER_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["ELARION_FLOWER_SCREENSHOT"])

        # live: a new event shows up without a reload
        send_probe(cluster.env)
        wait_until(lambda: any(r["job"] == PROBE_JOB for r in driver.execute_script(_ROWS_JS)),
                   20, message="the page to show a new event without a reload")

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
