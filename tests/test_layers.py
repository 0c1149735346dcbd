"""The package's floors: imports only run downward, and no module imports itself round.

Every import counts: at module level, inside a function (a lazy import), and under
``if TYPE_CHECKING:``. The floors, from the ground up (CONTRIBUTING.md says where a
new concept goes):

    exceptions -> schedules -> config -> store -> observe -> one_offs | live_schedules
    -> beat | worker -> operate -> cli | flower | testing
    -> demo | pytest plugin | contrib (the integrations: Django)
    -> the package's face and the moved-path modules

Rooms on one floor (``beat`` and ``worker``; ``cli``, ``flower`` and ``testing``;
``demo``, ``pytest`` and ``contrib``) never import each other. Inside a floor, a module
may import its neighbours, but no import cycle may remain anywhere. One exception: any
module may read the package's ``__version__``, which the face declares.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = "celery_elarion_beat"

#: (floor, room): rooms on one floor are siblings that never import each other.
FLOORS: dict[str, tuple[int, str]] = {
    "exceptions": (0, "exceptions"),
    "schedules": (1, "schedules"),
    "config": (2, "config"),
    "store": (3, "store"),
    "observe": (4, "observe"),
    "one_offs": (5, "one_offs"),
    "live_schedules": (5, "live_schedules"),
    "beat": (6, "beat"),
    "worker": (6, "worker"),
    "operate": (7, "operate"),
    "cli": (8, "cli"),
    "flower": (8, "flower"),
    "testing": (8, "testing"),
    "demo": (9, "demo"),
    "pytest": (9, "pytest"),
    "contrib": (9, "contrib"),
}
#: The top floor: the package's face and the modules that keep a moved path working.
FACE = (10, "face")
MOVED_PATHS = ("scheduler", "settings", "exporter", "cron", "logformat", "events", "control")

#: Value types and pure time, which never import SQLAlchemy (or a driver).
VALUE_TYPES = ("store.records", "store.control_records", "store.one_off_records",
               "store.entry_records", "store.foreign_records", "store.states", "schedules")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every module of the package *path* imports, however and wherever it does."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level <= len(base), f"{name}: a relative import above the package"
                anchor = base[:len(base) - node.level + 1]
                module = ".".join(anchor + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [alias.name for alias in node.names]
            if module == PACKAGE and names == ["__version__"]:
                continue  # the one exception: the version the face declares (setup.cfg
                # reads it there), which every module may read
            found.add(module)
            found.update(f"{module}.{name}" for name in names)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (names that are modules, not values)."""
    paths = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    return {name: {m for m in imports_of(path, name) if m in paths and m != name}
            for name, path in paths.items()}


def floor_of(module: str) -> tuple[int, str]:
    rest = module.split(".")[1:]
    if not rest or (len(rest) == 1 and rest[0] in MOVED_PATHS):
        return FACE
    return FLOORS[rest[0]]


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import that runs up a floor or across to a sibling room."""
    found = []
    for module, targets in sorted(graph.items()):
        floor, room = floor_of(module)
        for target in sorted(targets):
            to_floor, to_room = floor_of(target)
            if to_floor > floor or (to_floor == floor and to_room != room):
                found.append(f"{module} ({room}, floor {floor}) imports {target} "
                             f"({to_room}, floor {to_floor})")
    return found


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a
    module importing itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_stands_on_a_known_floor() -> None:
    for module in import_graph():
        floor_of(module)  # a new top-level room must be given a floor above


def test_every_import_of_the_package_names_a_module_or_a_name_of_one() -> None:
    """A moved module leaves no import behind that only fails at run time."""
    paths = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    for name, path in paths.items():
        for target in imports_of(path, name):
            if target.split(".")[0] != PACKAGE:
                continue
            assert target in paths or target.rpartition(".")[0] in paths, (
                f"{name} imports {target}, which is no module of the package")


def test_imports_only_run_down() -> None:
    assert violations(import_graph()) == []


def test_no_import_cycle_remains() -> None:
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(("source", "target"), [
    ("celery_elarion_beat.config.settings", "celery_elarion_beat.beat.scheduler"),
    ("celery_elarion_beat.store.interface", "celery_elarion_beat.observe.events"),
    ("celery_elarion_beat.beat.pipeline", "celery_elarion_beat.worker.runs"),
    ("celery_elarion_beat.cli.schedule", "celery_elarion_beat.contrib.django.command"),
])
def test_a_reversed_import_is_caught(source: str, target: str) -> None:
    graph = import_graph()
    graph[source] = set(graph[source]) | {target}
    assert any(line.startswith(source) and target in line for line in violations(graph))


def test_a_cycle_is_caught() -> None:
    graph = import_graph()
    graph["celery_elarion_beat.store.records"] = (
        set(graph["celery_elarion_beat.store.records"]) | {"celery_elarion_beat.store.interface"})
    assert any("celery_elarion_beat.store.records" in c for c in cycles(graph))


def test_value_types_never_import_sqlalchemy() -> None:
    paths = {module_name(p): p for p in (ROOT / PACKAGE).rglob("*.py")}
    for name, path in paths.items():
        if any(name == f"{PACKAGE}.{v}" or name.startswith(f"{PACKAGE}.{v}.")
               for v in VALUE_TYPES):
            heavy = {m for m in imports_of(path, name)
                     if m.split(".")[0] in ("sqlalchemy", "psycopg", "pymysql")}
            assert not heavy, f"{name} imports {sorted(heavy)}"


def test_every_backend_has_a_store_factory() -> None:
    from celery_elarion_beat.config.dsn import BACKENDS
    from celery_elarion_beat.store.registry import FACTORIES

    assert [b.name for b in BACKENDS] == list(FACTORIES)
