"""``celery -A proj elarion-beat schedule ...``: live schedules (:mod:`..live_schedules`).

* ``list [--json]``: every entry, code and database, with what runs under each name;
  ``--json`` prints a list of objects (name, task, schedule, source, enabled, revision,
  runs, overrides, problem, ...);
* ``show NAME [--json]``, ``history NAME [--json]``;
* ``add NAME --task T (--cron "S M H DOM MON DOW" [--tz ZONE] | --crontab "M H DOM MON
  DOW" [--tz ZONE] | --every SECONDS) [--args-json] [--kwargs-json] [--options-json]
  [--effective ISO] [--reason] [--disabled]``;
* ``edit NAME`` (the same options, only those given change; ``--restart``: an interval
  counts from the effective time; ``--revision N``: refused if the entry changed since);
* ``override NAME`` (a database entry in place of the code entry NAME: its definition,
  with the options given), ``remove NAME``, ``enable NAME``, ``disable NAME``;
* ``export [--json|--yaml]`` and ``import FILE [--dry-run] [--prune]`` (idempotent; one
  version bump per file);
* the commands other floors and packages plug in through the entry point group
  ``celery_elarion_beat.schedule_commands`` (loaded when named): ``import-django``
  (:mod:`celery_elarion_beat.contrib.django.command`).

Every change is one transaction; the beat nodes hear of it within about a second
(PostgreSQL: a NOTIFY; elsewhere ``elarion_beat_db_entries_poll``). Bad input exits 2,
naming the option and the fix, and writes nothing; a conflict (``--revision`` stale, a
name taken), a missing entry or a database error exits 1.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import click

from ..exceptions import ConfigurationError, ElarionBeatError
from ..live_schedules import api
from ..store.control_records import os_actor
from ..store.entry_records import EntryRevision, StoredEntry
from .context import StoreContext, app_of
from .text import table, utc

__all__ = ["PLUGIN_GROUP", "schedule_group"]

#: The entry point group of the ``schedule`` commands kept elsewhere (a floor above the
#: CLI, or another package): ``import-django = celery_elarion_beat.contrib.django...``.
PLUGIN_GROUP = "celery_elarion_beat.schedule_commands"

#: The option that sets each field (an error naming the field names the option).
_OPTIONS = {"task": "--task", "schedule": "--cron/--crontab/--every", "tz": "--tz",
            "args": "--args-json", "kwargs": "--kwargs-json", "options": "--options-json",
            "effective": "--effective", "reason": "--reason", "revision": "--revision",
            "name": "NAME"}
_FIELD = re.compile(r"^(\w+): ")


@contextmanager
def _refusing() -> Iterator[None]:
    """Bad input (exit 2) names the option that sets the field at fault; any other
    library error (a conflict, a missing entry, the database) exits 1."""
    try:
        yield
    except ConfigurationError as exc:
        text = str(exc)
        found = _FIELD.match(text)
        if found and found.group(1) in _OPTIONS:
            rest = text[found.end():]
            option = _OPTIONS[found.group(1)]
            if found.group(1) == "schedule":  # the schedule's own field: its option
                word = rest.split(" ", 1)[0]
                option = {"tz": "--tz", "cron": "--cron", "crontab": "--crontab",
                          "every": "--every"}.get(word, option)
            text = f"{option}: {rest}"
        raise click.UsageError(" ".join(text.split())) from exc
    except ElarionBeatError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from exc


def _schedule(cron: str | None, crontab: str | None, every: float | None,
              tz: str | None, required: bool) -> Any:
    given = [name for name, value in (("--cron", cron), ("--crontab", crontab),
                                      ("--every", every)) if value is not None]
    if len(given) > 1:
        raise click.UsageError(f"give one of --cron, --crontab, --every, not "
                               f"{' and '.join(given)}")
    if not given:
        if tz is not None:
            raise click.UsageError("--tz goes with --cron or --crontab")
        if required:
            raise click.UsageError('give the schedule: --cron "S M H DOM MON DOW" (six fields, '
                                   'seconds first), --crontab "M H DOM MON DOW" or --every '
                                   "SECONDS")
        return api.UNSET
    if every is not None:
        if tz is not None:
            raise click.UsageError("--tz goes with --cron or --crontab, not --every")
        return {"every": every}
    kind, value = ("cron", cron) if cron is not None else ("crontab", crontab)
    return {kind: value, **({"tz": tz} if tz else {})}


def _json_option(text: str | None) -> Any:
    return api.UNSET if text is None else text  # parsed (and named) by the definition


def _definition_options(f: Any) -> Any:
    for option in reversed([
        click.option("--task", help="The task to send (elarion_beat_db_entry_tasks allows it)."),
        click.option("--cron", help='Six fields, seconds first: "S M H DOM MON DOW".'),
        click.option("--crontab", help='Five fields, Celery\'s crontab: "M H DOM MON DOW".'),
        click.option("--every", type=float, help="An interval, in seconds."),
        click.option("--tz", help="The time zone of --cron/--crontab (IANA name; default the "
                     "app's timezone)."),
        click.option("--args-json", help='Positional arguments, a JSON list: \'[1, "a"]\'.'),
        click.option("--kwargs-json", help='Keyword arguments, a JSON object: \'{"days": 7}\'.'),
        click.option("--options-json", help='Send options, a JSON object: \'{"queue": "q"}\'.'),
        click.option("--effective", help="From when the change governs (ISO with an offset; "
                     "default the database clock's now, never earlier)."),
        click.option("--reason", default="", help="Why (kept in the history)."),
    ]):
        f = option(f)
    return f


def _entry_text(entry: StoredEntry | None) -> str:
    if entry is None:
        return "-"
    d = entry.definition
    return (f"{entry.name}: {d.task} {d.schedule.text()} "
            f"{'enabled' if d.enabled else 'disabled'}, revision {entry.revision}, effective "
            f"{utc(entry.effective_at)}")


def _print_written(entry: StoredEntry | None, verb: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(entry.as_dict() if entry else None, sort_keys=True))
        return
    click.echo(f"{verb} {_entry_text(entry)}")


class _ScheduleGroup(click.Group):
    """The ``schedule`` group: its own commands, and those plugged in through
    :data:`PLUGIN_GROUP` (listed by name, imported only when run or asked for help)."""

    @staticmethod
    def _plugged() -> dict[str, EntryPoint]:
        return {point.name: point for point in entry_points(group=PLUGIN_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugged()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = super().get_command(ctx, name)
        if found is not None:
            return found
        point = self._plugged().get(name)
        if point is None:
            return None
        command = point.load()
        if not isinstance(command, click.Command):
            raise click.ClickException(f"the entry point {point.value} ({PLUGIN_GROUP}) is no "
                                       "click command")
        return command


@click.group("schedule", cls=_ScheduleGroup)
def schedule_group() -> None:
    """Live schedules: list, add, edit, override, remove, enable, disable, history,
    export and import the schedule's database entries."""


@schedule_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """Every entry, code and database: name, source, task, schedule, enabled, revision,
    what runs under the name, and what is wrong with it."""
    with StoreContext(app_of(ctx)) as c, _refusing():
        views = api.list_entries(c.app, store=c.store)
    if as_json:
        click.echo(json.dumps([v.as_dict() for v in views], indent=2, sort_keys=True))
        return
    table(["name", "source", "task", "schedule", "enabled", "revision", "runs", "problem"],
          [[v.name, v.source + (" (override)" if v.overrides else ""), v.task, v.schedule,
            "yes" if v.enabled else "no", str(v.revision) if v.revision is not None else "-",
            v.runs or "nothing", v.problem or ""] for v in views])


@schedule_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
@click.pass_context
def show_command(ctx: click.Context, name: str, as_json: bool) -> None:
    """One entry, code or database."""
    with StoreContext(app_of(ctx)) as c, _refusing():
        view = api.get_entry(c.app, name, store=c.store)
    if as_json:
        click.echo(json.dumps(view.as_dict(), indent=2, sort_keys=True))
        return
    for key, value in view.as_dict().items():
        if key != "definition":
            click.echo(f"{key:>13}: {'-' if value is None else value}")
    if view.definition is not None:
        for key in ("args", "kwargs", "options"):
            click.echo(f"{key:>13}: {json.dumps(view.definition.as_json()[key])}")


def _change(ctx: click.Context, change: api.Change, reason: str, as_json: bool,
            verb: str) -> None:
    with StoreContext(app_of(ctx)) as c, _refusing():
        wrote = api.apply_changes(c.app, [change], reason=reason, actor=os_actor(),
                                  store=c.store)
    entry = wrote.entries[0] if wrote.entries else None
    if wrote.version is None:
        verb = "unchanged:"
    _print_written(entry, verb, as_json)


@schedule_group.command("add")
@click.argument("name")
@_definition_options
@click.option("--disabled", is_flag=True, help="Add it disabled.")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def add_command(ctx: click.Context, name: str, task: str | None, cron: str | None,
                crontab: str | None, every: float | None, tz: str | None,
                args_json: str | None, kwargs_json: str | None, options_json: str | None,
                effective: str | None, reason: str, disabled: bool, as_json: bool) -> None:
    """Add database entry NAME: its first run is its first slot at or after the
    effective time."""
    if task is None:
        raise click.UsageError("--task is required: the task to send, e.g. proj.tasks.report")
    schedule = _schedule(cron, crontab, every, tz, required=True)
    _change(ctx, api.Change("add", name, task, schedule, _json_option(args_json),
                            _json_option(kwargs_json), _json_option(options_json),
                            not disabled, effective=effective), reason, as_json, "added")


@schedule_group.command("edit")
@click.argument("name")
@_definition_options
@click.option("--restart", is_flag=True, help="An interval counts from the effective time "
              "(else it keeps its phase).")
@click.option("--revision", type=int, help="The revision you read: refused if it changed.")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def edit_command(ctx: click.Context, name: str, task: str | None, cron: str | None,
                 crontab: str | None, every: float | None, tz: str | None,
                 args_json: str | None, kwargs_json: str | None, options_json: str | None,
                 effective: str | None, reason: str, restart: bool, revision: int | None,
                 as_json: bool) -> None:
    """Change database entry NAME: only the options given change."""
    schedule = _schedule(cron, crontab, every, tz, required=False)
    _change(ctx, api.Change("edit", name, api.UNSET if task is None else task, schedule,
                            _json_option(args_json), _json_option(kwargs_json),
                            _json_option(options_json), revision=revision,
                            effective=effective, restart=restart), reason, as_json, "edited")


@schedule_group.command("override")
@click.argument("name")
@_definition_options
@click.option("--disabled", is_flag=True, help="Stop the code entry (an override that "
              "runs nothing).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.pass_context
def override_command(ctx: click.Context, name: str, task: str | None, cron: str | None,
                     crontab: str | None, every: float | None, tz: str | None,
                     args_json: str | None, kwargs_json: str | None,
                     options_json: str | None, effective: str | None, reason: str,
                     disabled: bool, as_json: bool) -> None:
    """Replace code entry NAME by a database entry: its definition with the options
    given. Reported when the code entry later changes; `remove` brings it back."""
    schedule = _schedule(cron, crontab, every, tz, required=False)
    _change(ctx, api.Change("override", name, api.UNSET if task is None else task, schedule,
                            _json_option(args_json), _json_option(kwargs_json),
                            _json_option(options_json), not disabled, effective=effective),
            reason, as_json, "overridden")


def _simple(verb: str, past: str) -> Any:
    @click.argument("name")
    @click.option("--revision", type=int, help="The revision you read: refused if it changed.")
    @click.option("--reason", default="", help="Why (kept in the history).")
    @click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
    @click.pass_context
    def command(ctx: click.Context, name: str, revision: int | None, reason: str,
                as_json: bool) -> None:
        _change(ctx, api.Change(verb, name, revision=revision), reason, as_json, past)

    command.__doc__ = {"remove": "Remove database entry NAME (an override: the code entry "
                                 "runs again).",
                       "enable": "Enable database entry NAME: it runs from its first slot "
                                 "from now on (no overdue run).",
                       "disable": "Disable database entry NAME (kept, with its history)."
                       }[verb]
    return schedule_group.command(verb)(command)


remove_command = _simple("remove", "removed")
enable_command = _simple("enable", "enabled")
disable_command = _simple("disable", "disabled")


def _history_row(rev: EntryRevision) -> list[str]:
    return [str(rev.revision), rev.action, utc(rev.at), utc(rev.effective_at), rev.actor,
            rev.definition.task, rev.definition.schedule.text(),
            "yes" if rev.definition.enabled else "no", rev.reason or ""]


@schedule_group.command("history")
@click.argument("name", required=False)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def history_command(ctx: click.Context, name: str | None, limit: int, as_json: bool) -> None:
    """The changes of database entry NAME (of every entry without NAME), newest first:
    revision, action, when, effective from, who, what, why."""
    with StoreContext(app_of(ctx)) as c, _refusing():
        revisions = api.entry_history(c.app, name, limit, store=c.store)
    if as_json:
        for rev in revisions:
            click.echo(json.dumps(rev.as_dict(), sort_keys=True))
        return
    table(["revision", "action", "at", "effective", "actor", "task", "schedule", "enabled",
           "reason"], [_history_row(rev) for rev in revisions], right=(0,))


@schedule_group.command("export")
@click.option("--json", "fmt", flag_value="json", default=True, help="JSON (the default).")
@click.option("--yaml", "fmt", flag_value="yaml", help="YAML (needs PyYAML).")
@click.pass_context
def export_command(ctx: click.Context, fmt: str) -> None:
    """The database entries, as `import` reads them back."""
    with StoreContext(app_of(ctx)) as c, _refusing():
        data = api.export_entries(c.app, store=c.store)
    if fmt == "yaml":
        yaml = _yaml()
        click.echo(yaml.safe_dump(data, sort_keys=True, allow_unicode=True), nl=False)
        return
    click.echo(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise click.UsageError("--yaml needs PyYAML: pip install 'celery-elarion-beat[yaml]'"
                               " (or use --json)") from None
    return yaml


def _read(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    if path.endswith((".yaml", ".yml")):
        try:
            return _yaml().safe_load(text)
        except Exception as exc:
            raise click.UsageError(f"FILE: {path} is not YAML: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        if path.endswith(".json"):
            raise click.UsageError(f"FILE: {path} is not JSON: {exc}") from None
        try:
            return _yaml().safe_load(text)
        except click.UsageError:
            raise
        except Exception:
            raise click.UsageError(f"FILE: {path} is neither JSON nor YAML ({exc})") from None


@schedule_group.command("import")
@click.argument("path", metavar="FILE", type=click.Path(allow_dash=True))
@click.option("--dry-run", is_flag=True, help="Say what would change; write nothing.")
@click.option("--prune", is_flag=True, help="Remove the database entries FILE does not name.")
@click.option("--reason", default="", help="Why (kept in the history).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def import_command(ctx: click.Context, path: str, dry_run: bool, prune: bool, reason: str,
                   as_json: bool) -> None:
    """Make the database entries what FILE says (as `export` writes it): one write, one
    version bump; importing it again changes nothing."""
    try:
        data = _read(path)
    except OSError as exc:
        raise click.UsageError(f"FILE: cannot read {path}: {exc.strerror}") from None
    with StoreContext(app_of(ctx)) as c, _refusing():
        report = api.import_entries(c.app, data, dry_run=dry_run, prune=prune, reason=reason,
                                    actor=os_actor(), store=c.store)
    if as_json:
        click.echo(json.dumps(report.as_dict(), sort_keys=True))
        return
    verb = "would" if dry_run else "did"
    click.echo(f"import ({'dry run' if dry_run else f'version {report.version}'}): {verb} "
               f"add {len(report.added)}, change {len(report.changed)}, remove "
               f"{len(report.removed)}; {len(report.unchanged)} unchanged")
    for title, names in (("add", report.added), ("change", report.changed),
                         ("remove", report.removed)):
        for name in names:
            click.echo(f"  {title} {name}")

