"""``celery -A proj elarion-beat pause|resume|trigger|audit``: live control
(:mod:`..operate.control`).

Each command works from any machine that has the app; beat need not be running.
Bad input exits 2 with the option named and nothing written; a database error
exits 1.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import click

from ..config.parsers import duration, format_duration
from ..exceptions import ConfigurationError
from ..operate.control import (
    active_pauses,
    audit_log,
    job_label,
    json_arguments,
    os_actor,
    parse_until,
    pause_job,
    resume_job,
    trigger_job,
)
from ..store.control_records import ALL_JOBS
from .context import StoreContext, app_of, period, refusing
from .text import table, utc

__all__ = ["audit_command", "pause_command", "resume_command", "trigger_command"]


def _job(job: str | None, every: bool, verb: str) -> str:
    if every and job:
        raise click.UsageError(f"give a JOB or --all, not both (`{verb} --all` {verb}s every "
                               "job)")
    if not every and not job:
        raise click.UsageError(f"give the JOB to {verb}, or --all for every job")
    return ALL_JOBS if every else str(job)


@click.command("pause")
@click.argument("job", required=False)
@click.option("--all", "every", is_flag=True, help="Pause every job (a maintenance window).")
@click.option("--until", "until_text", help="End the pause by itself at this ISO time "
              "(2026-12-01T06:00Z; without an offset, UTC).")
@click.option("--for", "for_text", help="End the pause by itself after this long (30m, 2h).")
@click.option("--reason", default="", help="Why: shown by status, the audit and Flower.")
@click.option("--json", "as_json", is_flag=True, help="Print the pause as JSON.")
@click.pass_context
def pause_command(ctx: click.Context, job: str | None, every: bool, until_text: str | None,
                  for_text: str | None, reason: str, as_json: bool) -> None:
    """Pause JOB on every node until resumed (or --until / --for): its occurrences are
    skipped with reason `paused`, from each node's next claim."""
    name = _job(job, every, "pause")
    if until_text and for_text:
        raise click.UsageError("give --until or --for, not both")
    with StoreContext(app_of(ctx)) as c, refusing():
        until: datetime | None = None
        if until_text is not None or for_text is not None:
            now = c.store.clock()
            until = (parse_until(until_text, now) if until_text is not None
                     else now + _positive("--for", str(for_text)))
        c.schedule()  # names the entries beat leaves out, if any
        pause = pause_job(c.app, c.store, name, actor=os_actor(), until=until, reason=reason)
    if as_json:
        click.echo(json.dumps({**pause.as_dict(), "cluster": c.store.cluster}, sort_keys=True))
        return
    click.echo(f"{job_label(name)} of cluster {c.store.cluster} {pause.describe()}; every "
               "node of the cluster skips it from its next claim (reason `paused`)")


def _positive(option: str, text: str) -> timedelta:
    span = duration(option, text)
    if span.total_seconds() <= 0:
        raise ConfigurationError(f"{option} {text!r} must be longer than 0 seconds")
    return span


@click.command("resume")
@click.argument("job", required=False)
@click.option("--all", "every", is_flag=True, help="Lift the pause of every job (`pause --all`).")
@click.pass_context
def resume_command(ctx: click.Context, job: str | None, every: bool) -> None:
    """Lift the pause of JOB (or `--all`): its next occurrence runs as scheduled."""
    name = _job(job, every, "resume")
    with StoreContext(app_of(ctx)) as c, refusing():
        lifted = resume_job(c.app, c.store, name, actor=os_actor())
        _, left = active_pauses(c.store)
    if lifted is None:
        click.echo(f"{job_label(name)} of cluster {c.store.cluster} was not paused; nothing "
                   "changed")
    else:
        click.echo(f"{job_label(name)} of cluster {c.store.cluster} resumed; it was paused "
                   f"since {utc(lifted.paused_at)} ({lifted.describe()})")
    still = [p for p in left if p.all_jobs or p.job == name]
    for pause in still:
        click.echo(f"note: {job_label(pause.job)} is still {pause.describe()}")


@click.command("trigger")
@click.argument("job")
@click.option("--args-json", help="Run with these positional arguments (a JSON array) "
              "instead of the entry's.")
@click.option("--kwargs-json", help="Run with these keyword arguments (a JSON object) "
              "instead of the entry's.")
@click.option("--force", is_flag=True, help="Run even if the job was triggered within "
              "elarion_beat_trigger_window.")
@click.option("--reason", default="", help="Why: kept in the audit.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_context
def trigger_command(ctx: click.Context, job: str, args_json: str | None,
                    kwargs_json: str | None, force: bool, reason: str, as_json: bool) -> None:
    """Run JOB now, once, with its own options plus the header elarion_manual=1 (beat
    need not be running). Exits 1 when it was not sent."""
    with StoreContext(app_of(ctx)) as c, refusing():
        args, kwargs = json_arguments(args_json, kwargs_json)
        c.schedule()  # names the entries beat leaves out, if any
        done = trigger_job(c.app, c.store, job, actor=os_actor(), args=args, kwargs=kwargs,
                           force=force, reason=reason, settings=c.settings)
        now = c.store.clock() if done.duplicate is not None else None
    if as_json:
        click.echo(json.dumps({**done.as_dict(), "cluster": c.store.cluster}, sort_keys=True))
    elif done.duplicate is not None and now is not None:
        dup = done.duplicate
        ago = format_duration(now - dup.occurrence, approximate=True)
        click.echo(f"not triggered: {job} was triggered {ago} ago by {dup.node} (task "
                   f"id {dup.task_id}, {dup.state}); add --force to run it again", err=True)
    elif done.sent:
        click.echo(f"triggered {job} of cluster {c.store.cluster}: task id {done.task_id}, "
                   "occurrence "
                   f"{utc(done.occurrence)} (kind manual)")
    else:
        click.echo(f"not sent: the broker refused {job} ({done.error}); the claim is marked "
                   "failed, and a new trigger may run it", err=True)
    ctx.exit(0 if done.sent else 1)


@click.command("audit")
@click.option("--job", help="Only this job ('' for the rows of `pause --all`).")
@click.option("--since", help="ISO time (2026-11-29T03:00:00Z) or a duration back (2h, 7d).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_context
def audit_command(ctx: click.Context, job: str | None, since: str | None, limit: int,
                  as_json: bool) -> None:
    """Who paused, resumed or triggered what in the app's cluster, when and why,
    newest first."""
    back = period(since)
    with StoreContext(app_of(ctx)) as c, refusing():
        start = c.store.clock() - back if isinstance(back, timedelta) else back
        rows = audit_log(c.store, job=job, since=start, limit=limit)
    if as_json:
        for row in rows:
            click.echo(json.dumps({**row.as_dict(), "cluster": c.store.cluster},
                                  sort_keys=True))
        return
    click.echo(f"cluster: {c.store.cluster}")
    table(["at", "actor", "action", "job", "reason", "until", "task id"],
          [[utc(r.at), r.actor, r.action + (f" ({r.detail})" if r.detail else ""),
            job_label(r.job), r.reason or "-", utc(r.until) if r.until else "-",
            r.task_id or "-"] for r in rows])
