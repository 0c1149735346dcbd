"""The package builds, checks and installs (issue #17, item 6).

``python -m build`` turns a copy of the tree's packaging files into an sdist, then a
wheel built from that sdist (so a file missing from the sdist fails here). Both pass
``twine check --strict``; the wheel holds ``py.typed``, every Flower template module
and the entry points; its version is ``celery_elarion_beat.__version__``. Then a fresh
venv (no system site packages) installs the wheel and runs it: the scheduler from its
``celery.beat_schedulers`` entry point ticks once over ``memory://``, and
``celery elarion-beat --help`` comes from the ``celery.commands`` one.

The build runs in ``tmp_path``: nothing is written into the source tree.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import celery_elarion_beat

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_elarion_beat"
#: what the build reads; tests, docs and examples are not shipped
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
SMOKE = Path(__file__).with_name("installed_smoke.py")

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]  # builds, then installs in a venv
# python -m build and a fresh venv: CPU and disk for a minute
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("packaging")]


def run(*args: str | Path, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout, env=env)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


def declared_entry_points() -> dict[str, set[str]]:
    """setup.cfg's [options.entry_points]: group -> names."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    section = parser["options.entry_points"]
    return {group: {line.split("=")[0].strip() for line in value.strip().splitlines()}
            for group, value in section.items()}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(PACKAGE, src / PACKAGE.name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in SOURCES:
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, src, cwd=src)
    return out


def data_files() -> set[str]:
    """The package's files that are not Python: the Django admin's templates (the Flower
    page's templates are modules)."""
    admin = PACKAGE / "contrib" / "django" / "templates" / "elarion_beat" / "admin"
    return {str(p.relative_to(ROOT)) for p in admin.iterdir() if p.suffix == ".html"}


def test_sdist_and_wheel_pass_twine_check_without_warnings(dist: Path) -> None:
    files = sorted(dist.iterdir())
    assert sorted(f.suffix for f in files) == [".gz", ".whl"], files
    result = run(sys.executable, "-m", "twine", "check", "--strict", *files, cwd=dist)
    assert result.stdout.count("PASSED") == 2, result.stdout
    assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_sdist_has_the_packaging_files_and_the_package(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    expected = {"README.md", "LICENSE", "setup.cfg", "pyproject.toml",
                "celery_elarion_beat/py.typed", "celery_elarion_beat/__init__.py"}
    expected |= data_files()
    assert expected <= names, sorted(expected - names)


def test_the_wheel_has_py_typed_the_admin_templates_the_entry_points_and_the_version(
        dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = archive.read(f"{info}/METADATA").decode()
    assert "celery_elarion_beat/py.typed" in names
    templates = data_files()
    assert templates and templates <= names, sorted(templates - names)
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(entry_points)
    shipped = {group: set(parser[group]) for group in parser.sections()}
    assert "elarion" in shipped["celery.beat_schedulers"]
    assert "elarion-beat" in shipped["celery.commands"]
    for group, points in declared_entry_points().items():  # pytest11 too, when declared
        assert points <= shipped.get(group, set()), (group, points, shipped)
    version = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
               if line.startswith("Version:")]
    assert version == [celery_elarion_beat.__version__]
    assert wheel.name.startswith(f"celery_elarion_beat-{celery_elarion_beat.__version__}-")


def test_the_version_is_declared_once() -> None:
    """setup.cfg reads __version__; no other packaging file or module spells it out."""
    version = celery_elarion_beat.__version__
    assert "version = attr: celery_elarion_beat.__version__" in (ROOT / "setup.cfg").read_text()
    spelled = [str(p.relative_to(ROOT)) for p in [ROOT / "pyproject.toml", ROOT / "setup.cfg",
                                                  *PACKAGE.rglob("*.py")]
               if version in p.read_text()]
    assert spelled == ["celery_elarion_beat/__init__.py"], spelled


def test_the_wheel_installs_in_a_fresh_venv_and_runs(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, celery = venv / "bin" / "python", venv / "bin" / "celery"
    run(python, "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path, timeout=300)
    # -I: isolated, so neither the source tree nor the test environment is importable
    smoke = json.loads(run(python, "-I", SMOKE, cwd=tmp_path).stdout)
    assert smoke["version"] == celery_elarion_beat.__version__
    assert Path(smoke["module"]).is_relative_to(venv), smoke["module"]
    assert smoke["scheduler"] == "celery_elarion_beat.beat.scheduler.ClaimingScheduler"
    assert smoke["outcomes"] == [["tick", "dispatched"]]
    assert [(h["task"], h["elarion_job"]) for h in smoke["published"]] == [("smoke.tick", "tick")]
    (tmp_path / "smoke_app.py").write_text(
        "from celery import Celery\napp = Celery('smoke_app', broker='memory://')\n")
    helped = run(celery, "-A", "smoke_app", "elarion-beat", "--help", cwd=tmp_path)
    assert "claims" in helped.stdout and "status" in helped.stdout, helped.stdout
