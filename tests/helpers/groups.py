"""``xdist_group`` that groups on every pytest this suite allows.

``--dist loadgroup`` (the project's pytest options) sends the tests of one
``@pytest.mark.xdist_group(name)`` to one worker, so a module-scoped cluster starts
once, not once per worker. pytest-xdist does it by appending ``@name`` to each item's
node id (``item._nodeid``) on the workers; from pytest 9 a node keeps its id in
``_id``, the attribute xdist writes is read by nobody, and every group is scattered
over the workers (xdist 3.8 with pytest 9.2: a six-test module on four workers built
its cluster four times). This hook runs after xdist's and appends the suffix where
xdist's did not take; on a pytest where xdist's works it changes nothing.
"""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The item's xdist group names as xdist joins them, or None."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    return "_".join(names) or None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # not an xdist worker of loadgroup
        return
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        grouped = f"{item.nodeid}@{group}"
        if hasattr(item, "_id"):  # pytest >= 9: the node id lives in _id
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(grouped)
        else:
            item._nodeid = grouped
        assert item.nodeid == grouped, f"cannot group {item.nodeid} ({group})"
