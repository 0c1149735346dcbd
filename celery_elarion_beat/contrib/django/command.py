"""``celery -A proj elarion-beat schedule import-django [--database ALIAS] [--dry-run]
[--disable-source]``: django-celery-beat's rows into the live schedules (:mod:`.importer`).

Plugged into the ``schedule`` group through the entry point group
``celery_elarion_beat.schedule_commands`` (the CLI never imports this floor). Django
is set up from ``DJANGO_SETTINGS_MODULE`` (which the project's Celery module sets);
nothing of Django is imported until the command runs.

Prints what it did, row by row where something is to be said, then a summary; exits 0
when every row was converted (or had nothing to convert: a one-off that ran, a
schedule that expired, a row a code entry stands for), 1 when a row could not be
converted or its entry exists with another definition (the others are imported), and
2 on bad input (Django not set up, an unknown alias, database entries off).
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ...cli.context import StoreContext, app_of, refusing
from ...store.control_records import os_actor

__all__ = ["import_django_command"]


def _django() -> None:
    """Set Django up (once), or say how."""
    try:
        import django
        from django.conf import settings
    except ImportError:
        raise click.UsageError("import-django needs Django (and django-celery-beat) installed "
                               "in this environment") from None
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise click.UsageError(
            "import-django reads the Django project's database: set DJANGO_SETTINGS_MODULE "
            "(the project's Celery module usually does: os.environ.setdefault("
            "'DJANGO_SETTINGS_MODULE', 'proj.settings'))")
    django.setup()


@click.command("import-django")
@click.option("--database", "alias", metavar="ALIAS", help="The Django database alias of "
              "django-celery-beat's tables (default: where Django's router reads them).")
@click.option("--dry-run", is_flag=True, help="Say what would be imported; write nothing.")
@click.option("--disable-source", is_flag=True, help="Disable the converted PeriodicTask rows "
              "(in the same transaction when the claims database is Django's).")
@click.option("--reason", default="imported from django-celery-beat", show_default=True,
              help="Why (kept in the entries' history).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def import_django_command(ctx: click.Context, alias: str | None, dry_run: bool,
                          disable_source: bool, reason: str, as_json: bool) -> None:
    """Convert django-celery-beat's PeriodicTask rows into database entries (crontab with
    its time zone, interval, solar) and durable one-offs (clocked, one-off rows), with
    their arguments, options, start time and expiry; seed the ledger so the cut-over
    fires nothing extra; report every row that cannot be converted. Importing again
    changes nothing."""
    app = app_of(ctx)
    _django()
    from .importer import import_django

    with StoreContext(app) as c, refusing():
        report = import_django(app, alias=alias, dry_run=dry_run,
                               disable_source=disable_source, reason=reason,
                               actor=os_actor("import-django"), store=c.store)
    if as_json:
        click.echo(json.dumps(report.as_dict(), sort_keys=True, default=str))
    else:
        _print(report, disable_source)
    ctx.exit(0 if report.ok else 1)


def _print(report: Any, disable_source: bool) -> None:
    would = "would " if report.dry_run else ""
    for title, names in (("add entry", report.added), ("schedule one-off", report.scheduled)):
        for name in names:
            click.echo(f"  {would}{title} {name}")
    for name in report.disabled:
        click.echo(f"  disabled PeriodicTask {name}")
    for name in report.seeded:
        click.echo(f"  ledger: last run of {name} under django-celery-beat")
    for text in report.skipped:
        click.echo(f"  skipped {text}")
    for text in report.differing:
        click.echo(f"  left alone {text}")
    for text in report.refused:
        click.echo(f"  NOT CONVERTED {text}")
    how = ("dry run, nothing written" if report.dry_run else
           f"version {report.version}" if report.version is not None else "no entry written")
    if not report.dry_run and report.one_transaction is not None:
        how += ("; one transaction with Django's database" if report.one_transaction else
                "; the claims database committed first, then Django's")
    click.echo(f"import-django ({how}): {report.rows} rows; {would}add {len(report.added)} "
               f"entries, {would}schedule {len(report.scheduled)} one-offs; "
               f"{len(report.unchanged)} imported already; {len(report.skipped)} skipped; "
               f"{len(report.differing)} left alone; {len(report.refused)} not converted"
               + (f"; {len(report.disabled)} source rows disabled" if disable_source else ""))
