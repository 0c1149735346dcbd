"""The documentation site builds with warnings as errors, and stays in step with the code.

``mkdocs build --strict`` fails on a nav entry without its page, a link to a
missing page or anchor, and a docs file left out of the nav.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from celery_elarion_beat import ConfigurationError, demo
from celery_elarion_beat.config.overlap import entry_overlap

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_mkdocs_build_strict_succeeds(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "comparison" / "index.html").is_file()


def nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def test_the_nav_has_every_section_of_the_site() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    for page in ("quickstart.md", "howto/multi-node.md", "howto/every-node.md", "flower.md",
                 "howto/migrations.md", "howto/purge.md", "howto/database-role.md",
                 "howto/live-control.md",
                 "runs.md", "settings.md", "operations.md", "design.md", "benchmarks.md",
                 "comparison.md"):
        assert page in pages, page
    assert config["theme"]["name"] in ("mkdocs", "readthedocs")  # built in: no network
    assert not config.get("plugins")


def test_the_comparison_cites_a_source_for_every_project() -> None:
    text = (DOCS / "comparison.md").read_text()
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for project, source in (("Stock Celery beat", "docs.celeryq.dev"),
                            ("RedBeat", "github.com/sibson/redbeat"),
                            ("django-celery-beat", "github.com/celery/django-celery-beat"),
                            ("single-beat", "github.com/ybrs/single-beat"),
                            ("celery-once", "github.com/cameronmaske/celery-once")):
        assert f"https://{source}" in sections[project], project


def test_the_quickstart_shows_the_demo_table_as_the_demo_prints_it() -> None:
    out = io.StringIO()
    demo.print_verdict(demo.build_verdict([], [], []), out)
    printed = out.getvalue().splitlines()
    quickstart = (DOCS / "quickstart.md").read_text()
    header = next(line for line in printed if line.startswith("job "))
    assert header in quickstart
    node_header = next(line for line in printed if line.startswith("node "))
    assert node_header in quickstart
    assert "python -m celery_elarion_beat.demo" in quickstart


def test_the_readme_lists_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1]
    links = re.findall(r"\]\((docs/[^)#]+)", section)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link


def test_the_runs_page_quotes_the_refusal_of_overlap_on_every_node_entries() -> None:
    """docs/runs.md shows the error beat stops with, as the code words it."""
    with pytest.raises(ConfigurationError) as caught:
        entry_overlap("refresh-cache", {"overlap": "skip"}, 3600.0, 30.0, every_node=True)
    assert str(caught.value) in (DOCS / "runs.md").read_text()
