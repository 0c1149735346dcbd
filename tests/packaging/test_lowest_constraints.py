"""constraints/lowest.txt pins exactly the minimums that setup.cfg declares.

``.ci/lowest`` runs the fast part of the suite on those pins; a minimum raised or
lowered in one file and not in the other would test versions nobody declared (or
declare versions nobody tests). The README's supported range starts at them too.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOWEST = ROOT / "constraints" / "lowest.txt"


def declared_minimums(setup_cfg: str) -> dict[str, Version]:
    """Each direct dependency of the package and of every extra: its declared minimum
    (``>=``, ``==`` or ``~=``). A dependency with none, or with two different ones in
    two places, is an error: the lowest step could not pin it."""
    cfg = configparser.ConfigParser()
    cfg.read_string(setup_cfg)
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in cfg["options.extras_require"].values():
        lines += extra.splitlines()
    out: dict[str, Version] = {}
    for line in filter(None, (raw.strip() for raw in lines)):
        req = Requirement(line)
        floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
        assert floors, f"setup.cfg: {line!r} declares no minimum; add one (>=X.Y)"
        name, floor = canonicalize_name(req.name), max(floors)
        assert out.get(name, floor) == floor, (
            f"setup.cfg: {req.name} has two minimums, {out[name]} and {floor}")
        out[name] = floor
    return out


def pinned(constraints: str) -> dict[str, Version]:
    """The pins of a constraints file (``name==X``, one a line, ``#`` comments)."""
    out: dict[str, Version] = {}
    for raw in constraints.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"constraints/lowest.txt: {line!r} is not a pin (==)"
        name = canonicalize_name(req.name)
        assert name not in out, f"constraints/lowest.txt pins {req.name} twice"
        out[name] = Version(spec.version)
    return out


def test_the_lowest_constraints_pin_exactly_the_declared_minimums() -> None:
    declared = declared_minimums((ROOT / "setup.cfg").read_text())
    pins = pinned(LOWEST.read_text())
    assert "celery" in declared and "croniter" in declared  # the files were read
    unpinned = sorted(set(declared) - set(pins))
    assert not unpinned, f"declared in setup.cfg, not pinned in {LOWEST.name}: {unpinned}"
    undeclared = sorted(set(pins) - set(declared))
    assert not undeclared, (f"pinned in {LOWEST.name}, not a direct dependency in setup.cfg: "
                            f"{undeclared}")
    differ = {name: (str(declared[name]), str(pins[name])) for name in declared
              if declared[name] != pins[name]}
    assert not differ, f"setup.cfg minimum vs {LOWEST.name} pin: {differ}"


def test_the_readme_states_the_supported_range_from_the_lowest_pins() -> None:
    """The README's ``Supported:`` paragraph starts Celery, kombu, SQLAlchemy, psycopg and
    croniter at the pins of constraints/lowest.txt."""
    (line,) = [" ".join(par.split()) for par in (ROOT / "README.md").read_text().split("\n\n")
               if par.startswith("**Supported:**")]
    pins = pinned(LOWEST.read_text())
    for name, label in [("celery", "Celery"), ("kombu", "kombu"), ("sqlalchemy", "SQLAlchemy"),
                        ("psycopg", "psycopg"), ("croniter", "croniter")]:
        low = pins[name]
        shown = re.search(rf"\b{label} (\d+(?:\.\d+)*)[-–]", line)
        assert shown, f"README's Supported line names no range for {label}: {line}"
        assert Version(shown[1]) == low, f"README: {label} from {shown[1]}, lowest pin {low}"


def test_a_disagreement_is_found() -> None:
    """The checks above can fail: a minimum raised in setup.cfg alone is seen."""
    text = (ROOT / "setup.cfg").read_text().replace("celery>=5.3", "celery>=5.4", 1)
    assert declared_minimums(text)["celery"] != pinned(LOWEST.read_text())["celery"]
