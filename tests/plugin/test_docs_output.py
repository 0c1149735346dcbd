"""docs/testing.md shows what ``simulate`` sends around the 2026-03-29 jump for
tests/plugin/user_proj.py: the page's lines are what the code prints today."""

from __future__ import annotations

import re
from pathlib import Path

from celery_elarion_beat.testing import simulate
from tests.plugin import user_proj

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def test_the_pages_simulation_output_is_current() -> None:
    text = PAGE.read_text()
    block = re.search(r"```text\n(.*?)```", text, re.S)
    assert block is not None
    shown = block.group(1).splitlines()
    lines = [f"{o.slot:%Y-%m-%d %H:%M}Z  sent {o.sent_at:%H:%M:%S}Z  {o.job:<15} "
             f"{o.kind:<6} {o.placement:<10} {o.node}"
             for o in simulate(user_proj.app, "2026-03-28T18:00", "2026-03-29T06:00")]
    assert shown == lines
