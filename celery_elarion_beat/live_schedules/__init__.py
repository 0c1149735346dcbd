"""Live schedules: entries kept in the database, edited while the cluster runs.

* :mod:`.api`: ``add_entry``, ``edit_entry``, ``override_entry``, ``remove_entry``,
  ``enable_entry``, ``disable_entry``, ``apply_changes`` (several, one version bump),
  ``plan_changes`` (what it would write, checked, writing nothing),
  ``list_entries``, ``get_entry``, ``entry_history``, ``export_entries``,
  ``import_entries`` (each taking an optional caller's ``connection=``);
* :mod:`.rules`: one name space for code and database entries (which of the two runs);
* :mod:`.listing`: the schedule as it runs, code and database entries together.

Beat's side is :mod:`celery_elarion_beat.beat.live_entries`; the records are
:mod:`celery_elarion_beat.store.entry_records`; the tables
:func:`celery_elarion_beat.store.schema.entries_table` and its neighbours.
"""

from __future__ import annotations

from .api import (
    UNSET,
    Change,
    ImportReport,
    add_entry,
    apply_changes,
    disable_entry,
    edit_entry,
    enable_entry,
    entry_history,
    export_entries,
    get_entry,
    import_entries,
    list_entries,
    override_entry,
    plan_changes,
    remove_entry,
)
from .listing import EntryView, read_live_schedule

__all__ = ["UNSET", "Change", "EntryView", "ImportReport", "add_entry", "apply_changes",
           "disable_entry", "edit_entry", "enable_entry", "entry_history", "export_entries",
           "get_entry", "import_entries", "list_entries", "override_entry",
           "plan_changes", "read_live_schedule", "remove_entry"]
