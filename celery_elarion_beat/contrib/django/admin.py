"""The admin of the database entries: Django's changelist over the entries table (read
through the unmanaged :class:`~.models.DatabaseEntry`), and views of its own that write
through :mod:`celery_elarion_beat.live_schedules`, never the ORM:

* **add**, **change**: a form (:class:`~.forms.EntryForm`) with a required reason; the
  change form carries the revision it showed, and a save of a stale form is refused
  with 409 and the conflict shown (who changed the entry since, and why), nothing
  written. The change view lists the entry's next occurrences (:mod:`.preview`) and its
  latest revisions;
* **remove** (the delete view) asks for a reason and carries the revision too;
* **enable**, **disable**, **remove** the selected entries: one change, one version bump,
  each entry's revision as listed on the confirmation page;
* **history**: the entry's revisions (who, when, effective from when, why).

The admin user is the actor (``alice (django admin)``). On PostgreSQL, when the
claims database is Django's (:mod:`.binding`), each write runs in Django's transaction
on Django's connection, and the nodes hear of it at its commit.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone as dj_timezone

from ...config.live_entries import EntryDefinition
from ...exceptions import ConfigurationError, ElarionBeatError, EntryConflict, EntryNotFound
from ...live_schedules import api
from ...operate.preview import PreviewRow
from ...store.entry_records import EntryRevision
from ...store.interface import ClaimStore
from .binding import Beat, beat, bind_table, transaction_connection
from .forms import EntryForm, ReasonForm, field_of, initial_of
from .models import DatabaseEntry
from .preview import entry_preview

__all__ = ["DatabaseEntryAdmin"]

_TEMPLATES = "elarion_beat/admin/"
#: The stores whose entries tables are known to exist.
_READY: weakref.WeakSet[ClaimStore] = weakref.WeakSet()


def _actor(request: HttpRequest) -> str:
    return f"{request.user.get_username() or 'anonymous'} (django admin)"


def _definition(row: DatabaseEntry) -> EntryDefinition:
    return EntryDefinition.from_columns({
        "task": row.task, "schedule": row.schedule, "args": row.args, "kwargs": row.kwargs,
        "options": row.options, "enabled": row.enabled})


@admin.register(DatabaseEntry)
class DatabaseEntryAdmin(admin.ModelAdmin):
    list_display = ("name", "task", "schedule_shown", "enabled", "revision", "effective_at",
                    "updated_at", "actor")
    list_filter = ("enabled", "overrides")
    search_fields = ("name", "task")
    ordering = ("name",)
    list_per_page = 100
    actions = ["enable_selected", "disable_selected", "remove_selected"]

    # -- reading -----------------------------------------------------------------

    def _beat(self) -> Beat:
        found = beat()
        if found.store not in _READY:
            found.store.entries_version(found.cluster)  # creates the tables, or says how to
            _READY.add(found.store)
        bind_table(self.model, found.settings)
        return found

    def get_queryset(self, request: HttpRequest) -> Any:
        found = self._beat()
        return super().get_queryset(request).using(found.alias).filter(cluster=found.cluster)

    @admin.display(description="schedule")
    def schedule_shown(self, row: DatabaseEntry) -> str:
        return row.schedule_text

    def get_actions(self, request: HttpRequest) -> Any:
        found = super().get_actions(request)
        found.pop("delete_selected", None)  # removing asks for a reason: remove_selected
        return found

    def _problem(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": "Database entries", "problem": " ".join(str(exc).split())}
        return TemplateResponse(request, _TEMPLATES + "problem.html", context, status=503)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        try:
            self._beat()
        except ElarionBeatError as exc:
            return self._problem(request, exc)
        return super().changelist_view(request, extra_context)

    def _render(self, request: HttpRequest, template: str, title: str, status: int = 200,
                **context: Any) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": title, "has_view_permission": self.has_view_permission(request),
                   "changelist_url": reverse("admin:elarion_beat_databaseentry_changelist"),
                   **context}
        return TemplateResponse(request, _TEMPLATES + template, context, status=status)

    def _row(self, request: HttpRequest, name: str) -> DatabaseEntry | None:
        found = self.get_queryset(request).filter(name=name).first()
        return found if isinstance(found, DatabaseEntry) else None

    def _missing(self, request: HttpRequest, name: str) -> HttpResponse:
        messages.warning(request, f"There is no database entry named {name!r} (removed?).")
        return HttpResponseRedirect(reverse("admin:elarion_beat_databaseentry_changelist"))

    def _change_url(self, name: str) -> str:
        return str(reverse("admin:elarion_beat_databaseentry_change", args=(quote(name),)))

    def _conflict_text(self, found: Beat, name: str, read: int | None,
                       exc: ElarionBeatError) -> str:
        history = api.entry_history(found.app, name, 1, store=found.store)
        if not history:
            return f"The entry {name!r} was removed since you read it: nothing was saved."
        last = history[0]
        return (f"The entry {name!r} changed since you read it (you read revision "
                f"{read if read is not None else '?'}; it is at revision {last.revision}, "
                f"{last.action} by {last.actor}" + (f": {last.reason!r}" if last.reason else "")
                + "). Nothing was saved: open the entry again to see it as it is, then repeat "
                "your change.")

    # -- add and change ------------------------------------------------------------

    def add_view(self, request: HttpRequest, form_url: str = "",
                 extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        try:
            found = self._beat()
        except ElarionBeatError as exc:
            return self._problem(request, exc)
        form = EntryForm(request.POST if request.method == "POST" else None, adding=True)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                with transaction.atomic(using=found.alias):
                    entry = api.add_entry(
                        found.app, data["name"], data["task"], data["schedule"],
                        list(data["definition"].args), dict(data["definition"].kwargs),
                        dict(data["definition"].options), enabled=bool(data["enabled"]),
                        effective=data.get("effective"), reason=data["reason"],
                        actor=_actor(request),
                        connection=transaction_connection(found.alias, found.settings),
                        store=found.store)
            except (ConfigurationError, EntryConflict) as exc:
                where, text = field_of(exc) if isinstance(exc, ConfigurationError) \
                    else ("name", " ".join(str(exc).split()))
                form.add_error(where if where in form.fields else None, text)
            else:
                self.log_addition(request, DatabaseEntry(name=entry.name,
                                                         cluster=found.cluster),
                                  f"added (revision {entry.revision}): {data['reason']}")
                messages.success(request, f"Added {entry.name!r} (revision {entry.revision}).")
                return HttpResponseRedirect(self._change_url(entry.name))
        return self._render(request, "entry_form.html", "Add database entry",
                            status=400 if form.errors else 200, form=form, adding=True,
                            can_change=True, cluster=found.cluster)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        try:
            found = self._beat()
        except ElarionBeatError as exc:
            return self._problem(request, exc)
        name = unquote(object_id)
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        row = self._row(request, name)
        if row is None:
            return self._missing(request, name)
        can_change = self.has_change_permission(request, row)
        current = _definition(row)
        initial = {**initial_of(current), "name": row.name, "revision": row.revision}
        conflict = None
        status = 200
        if request.method == "POST":
            if not can_change:
                raise PermissionDenied
            form = EntryForm(request.POST, adding=False, initial=initial)
            if form.is_valid():
                result = self._save_change(request, found, row, current, form)
                if isinstance(result, HttpResponse):
                    return result
                conflict = result
                status = 409 if conflict else 400
            else:
                status = 400
        else:
            form = EntryForm(initial=initial, adding=False)
        if not can_change:
            for each in form.fields.values():
                each.disabled = True
        history = api.entry_history(found.app, name, 50, store=found.store)
        preview = entry_preview(found.app, found.settings, found.store, name, history,
                                found.store.clock())
        return self._render(request, "entry_form.html", f"Change database entry {name!r}",
                            status=status, form=form, adding=False, can_change=can_change,
                            row=row, conflict=conflict, preview_note=preview.note,
                            occurrences=[_occurrence(occ) for occ in preview.rows],
                            history=[_revision(rev) for rev in history[:10]],
                            history_url=reverse("admin:elarion_beat_databaseentry_history",
                                                args=(quote(name),)),
                            delete_url=reverse("admin:elarion_beat_databaseentry_delete",
                                               args=(quote(name),)),
                            can_delete=self.has_delete_permission(request, row),
                            cluster=found.cluster)

    def _save_change(self, request: HttpRequest, found: Beat, row: DatabaseEntry,
                     current: EntryDefinition, form: EntryForm) -> HttpResponse | str | None:
        """Write the change; a redirect when done, the conflict's text when refused as
        stale, None when the API refused a field (put on the form)."""
        data = form.cleaned_data
        wanted: EntryDefinition = data["definition"]
        revision = data.get("revision")
        only_switch = dataclasses.replace(wanted, enabled=current.enabled).same(current) \
            and wanted.enabled != current.enabled and not data.get("effective")
        if only_switch:
            change = api.Change("enable" if wanted.enabled else "disable", row.name,
                                revision=revision)
        else:
            change = api.Change("edit", row.name, wanted.task, data["schedule"],
                                list(wanted.args), dict(wanted.kwargs), dict(wanted.options),
                                wanted.enabled, revision=revision,
                                effective=data.get("effective"),
                                restart=bool(data.get("restart")))
        try:
            with transaction.atomic(using=found.alias):
                wrote = api.apply_changes(
                    found.app, [change], reason=data["reason"], actor=_actor(request),
                    connection=transaction_connection(found.alias, found.settings),
                    store=found.store)
        except (EntryConflict, EntryNotFound) as exc:
            return self._conflict_text(found, row.name, revision, exc)
        except ConfigurationError as exc:
            where, text = field_of(exc)
            form.add_error(where if where in form.fields else None, text)
            return None
        entry = wrote.entries[0] if wrote.entries else None
        if wrote.version is None or entry is None:
            messages.info(request, f"Nothing changed in {row.name!r}.")
        else:
            self.log_change(request, row, f"{change.action} (revision {entry.revision}): "
                                          f"{data['reason']}")
            messages.success(request, f"Saved {row.name!r}: revision {entry.revision}, "
                                      f"effective {entry.effective_at:%Y-%m-%d %H:%M:%S} UTC.")
        return HttpResponseRedirect(self._change_url(row.name))

    # -- remove and history ----------------------------------------------------------

    def delete_view(self, request: HttpRequest, object_id: str,
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        try:
            found = self._beat()
        except ElarionBeatError as exc:
            return self._problem(request, exc)
        name = unquote(object_id)
        row = self._row(request, name)
        if row is None:
            return self._missing(request, name)
        if not self.has_delete_permission(request, row):
            raise PermissionDenied
        conflict = None
        if request.method == "POST":
            form = ReasonForm(request.POST)
            if form.is_valid():
                revision = form.cleaned_data.get("revision")
                try:
                    with transaction.atomic(using=found.alias):
                        api.remove_entry(
                            found.app, name, revision=revision,
                            reason=form.cleaned_data["reason"], actor=_actor(request),
                            connection=transaction_connection(found.alias, found.settings),
                            store=found.store)
                except (EntryConflict, EntryNotFound) as exc:
                    conflict = self._conflict_text(found, name, revision, exc)
                except ConfigurationError as exc:
                    form.add_error(None, " ".join(str(exc).split()))
                else:
                    if hasattr(self, "log_deletions"):  # Django 5.1 on
                        self.log_deletions(request, [row])
                    else:
                        self.log_deletion(request, row, name)
                    messages.success(request, f"Removed {name!r}.")
                    return HttpResponseRedirect(
                        reverse("admin:elarion_beat_databaseentry_changelist"))
        else:
            form = ReasonForm(initial={"revision": row.revision})
        return self._render(request, "entry_delete.html", f"Remove database entry {name!r}",
                            status=409 if conflict else (400 if form.errors else 200),
                            form=form, row=row, conflict=conflict,
                            change_url=self._change_url(name))

    def history_view(self, request: HttpRequest, object_id: str,
                     extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            found = self._beat()
        except ElarionBeatError as exc:
            return self._problem(request, exc)
        name = unquote(object_id)
        history = api.entry_history(found.app, name, 500, store=found.store)
        return self._render(request, "entry_history.html", f"History of {name!r}",
                            name=name, history=[_revision(rev) for rev in history],
                            change_url=self._change_url(name))

    # -- actions ---------------------------------------------------------------------

    def _bulk(self, request: HttpRequest, queryset: Any, verb: str) -> HttpResponse | None:
        allowed = self.has_delete_permission(request) if verb == "remove" \
            else self.has_change_permission(request)
        if not allowed:
            raise PermissionDenied
        found = self._beat()
        rows = list(queryset)
        form = ReasonForm(request.POST if "confirm" in request.POST else None)
        if "confirm" in request.POST and form.is_valid():
            try:
                read = {str(k): int(v) for k, v in
                        json.loads(request.POST.get("revisions") or "{}").items()}
            except (ValueError, TypeError, AttributeError):
                read = {}
            changes = [api.Change(verb, row.name, revision=read.get(row.name, row.revision))
                       for row in rows]
            try:
                with transaction.atomic(using=found.alias):
                    wrote = api.apply_changes(
                        found.app, changes, reason=form.cleaned_data["reason"],
                        actor=_actor(request),
                        connection=transaction_connection(found.alias, found.settings),
                        store=found.store)
            except (EntryConflict, EntryNotFound, ConfigurationError) as exc:
                self.message_user(request, "Nothing was changed: " + " ".join(str(exc).split())
                                  + " Select the entries again.", messages.ERROR)
                return None
            done = "nothing changed" if wrote.version is None else \
                f"version {wrote.version}"
            self.message_user(request, f"{verb.capitalize()}d {len(rows)} database entries "
                                       f"({done}).", messages.SUCCESS)
            return None
        return self._render(
            request, "entry_action.html", f"{verb.capitalize()} database entries", verb=verb,
            rows=rows, form=form, action=f"{verb}_selected",
            action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
            revisions=json.dumps({row.name: row.revision for row in rows}))

    @admin.action(description="Enable the selected entries")
    def enable_selected(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._bulk(request, queryset, "enable")

    @admin.action(description="Disable the selected entries")
    def disable_selected(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._bulk(request, queryset, "disable")

    @admin.action(description="Remove the selected entries")
    def remove_selected(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._bulk(request, queryset, "remove")

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        raise PermissionDenied  # removing goes through the API (remove_selected)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        raise PermissionDenied  # every write goes through the API (the views above)


def _occurrence(row: PreviewRow) -> dict[str, Any]:
    shown = row.as_dict()
    return {"utc": shown["utc"], "local": f"{shown['local']} {shown['zone']}",
            "revision": row.job.rpartition("@")[2], "kind": row.kind, "anchor": row.anchor,
            "note": "; ".join(filter(None, [row.dst_mark, f"paused by {row.paused.paused_by}"
                                            if row.paused else ""]))}


def _revision(rev: EntryRevision) -> dict[str, Any]:
    return {"revision": rev.revision, "action": rev.action,
            "at": dj_timezone.localtime(rev.at), "effective": dj_timezone.localtime(
                rev.effective_at), "actor": rev.actor, "reason": rev.reason,
            "task": rev.definition.task, "schedule": rev.definition.schedule.text(),
            "enabled": rev.definition.enabled}
