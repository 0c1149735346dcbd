"""The admin's forms: an entry (add and change), and a reason (remove, enable, disable).

The forms only gather what the live-schedules API takes; the API checks it (and
:func:`field_of` puts each of its refusals on the field it names). The schedule is a
kind and an expression: ``crontab`` ``0 6 * * 1-5`` (five fields), ``cron`` ``0 0 6 * *
1-5`` (six, seconds first), ``every`` ``3600`` (seconds), ``solar`` ``sunset 52.52
13.40`` (event, latitude, longitude); a time zone for cron and crontab.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from ...config.live_entries import EntryDefinition, ScheduleSpec
from ...exceptions import ConfigurationError

__all__ = ["EntryForm", "ReasonForm", "field_of", "initial_of", "schedule_of"]

_KIND_CHOICES = [("crontab", "crontab: M H DOM MON DOW"),
                 ("cron", "cron: S M H DOM MON DOW (seconds first)"),
                 ("every", "every: an interval in seconds"),
                 ("solar", "solar: EVENT LATITUDE LONGITUDE")]
#: The API's field (the text before ``": "`` in its message) -> the form's field.
_FIELDS = {"name": "name", "task": "task", "schedule": "expression", "tz": "tz",
           "args": "args", "kwargs": "kwargs", "options": "options",
           "effective": "effective", "reason": "reason", "enabled": "enabled"}
_JSON = {"rows": 2, "cols": 60, "style": "font-family: monospace"}


def field_of(exc: ConfigurationError) -> tuple[str | None, str]:
    """The form field an API refusal names (None: the form as a whole), and its text."""
    text = " ".join(str(exc).split())
    head, _, rest = text.partition(": ")
    if head in _FIELDS and rest:
        if head == "schedule" and rest.startswith("tz "):
            return "tz", rest
        return _FIELDS[head], rest
    return None, text


def schedule_of(kind: str, expression: str, tz: str) -> dict[str, Any]:
    """The schedule JSON of the form's kind, expression and time zone."""
    expression = " ".join(expression.split())
    if kind == "every":
        try:
            seconds: float = float(expression)
        except ValueError:
            raise ConfigurationError(f"schedule: every takes a number of seconds, not "
                                     f"{expression!r}") from None
        return {"every": int(seconds) if seconds == int(seconds) else seconds}
    if kind == "solar":
        parts = expression.split()
        if len(parts) != 3:
            raise ConfigurationError(f"schedule: solar takes EVENT LATITUDE LONGITUDE (e.g. "
                                     f"'sunset 52.52 13.40'), not {expression!r}")
        try:
            lat, lon = float(parts[1]), float(parts[2])
        except ValueError:
            raise ConfigurationError(f"schedule: solar's latitude and longitude are numbers, "
                                     f"not {parts[1]!r} {parts[2]!r}") from None
        return {"solar": parts[0], "lat": lat, "lon": lon}
    return {kind: expression, **({"tz": tz.strip()} if tz.strip() else {})}


def initial_of(definition: EntryDefinition) -> dict[str, Any]:
    """The form's initial values for *definition*."""
    spec = definition.schedule
    if spec.kind == "every":
        expression = f"{spec.every:g}"
    elif spec.kind == "solar":
        expression = f"{spec.event} {spec.lat:g} {spec.lon:g}"
    else:
        expression = spec.expr or ""
    return {"task": definition.task, "kind": spec.kind, "expression": expression,
            "tz": spec.tz or "", "args": json.dumps(list(definition.args)),
            "kwargs": json.dumps(dict(definition.kwargs), sort_keys=True),
            "options": json.dumps(dict(definition.options), sort_keys=True),
            "enabled": definition.enabled}


class ReasonForm(forms.Form):
    """Why (required): kept in the revision history. *revision*: the one read."""

    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2,
                                                                          "cols": 60}),
                             help_text="Why: kept in the entry's history (the audit).")
    revision = forms.IntegerField(widget=forms.HiddenInput, required=False)


class EntryForm(ReasonForm):
    """An entry: add (with *name*) or change (the name fixed)."""

    name = forms.CharField(max_length=191)
    task = forms.CharField(max_length=500, help_text="The task to send; "
                           "elarion_beat_db_entry_tasks must allow it.")
    kind = forms.ChoiceField(choices=_KIND_CHOICES, label="Schedule")
    expression = forms.CharField(max_length=500, help_text=(
        "crontab: 0 6 * * 1-5 | cron: 0 0 6 * * 1-5 | every: 3600 | solar: sunset 52.52 "
        "13.40"))
    tz = forms.CharField(max_length=64, required=False, label="Time zone", help_text=(
        "An IANA name for cron and crontab (Europe/Berlin); empty: the app's timezone."))
    args = forms.CharField(required=False, initial="[]", label="Positional arguments",
                           widget=forms.Textarea(attrs=_JSON), help_text="A JSON list.")
    kwargs = forms.CharField(required=False, initial="{}", label="Keyword arguments",
                             widget=forms.Textarea(attrs=_JSON), help_text="A JSON object.")
    options = forms.CharField(required=False, initial="{}", label="Send options",
                              widget=forms.Textarea(attrs=_JSON), help_text=(
                                  'A JSON object: {"queue": "reports", "expires": 600}.'))
    enabled = forms.BooleanField(required=False, initial=True)
    effective = forms.DateTimeField(required=False, label="Effective from", help_text=(
        "From when the change governs the occurrences (in the current time zone, or with "
        "an offset); empty: now. Earlier occurrences keep the entry as it was."))
    restart = forms.BooleanField(required=False, label="Restart the interval", help_text=(
        "An interval counts from the effective time (else it keeps its rhythm)."))

    field_order = ["name", "task", "kind", "expression", "tz", "args", "kwargs", "options",
                   "enabled", "effective", "restart", "reason", "revision"]

    def __init__(self, *args: Any, adding: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not adding:
            self.fields["name"].disabled = True
            self.fields["enabled"].help_text = "Switch it off and on (kept, with its history)."
        else:
            self.fields["restart"].widget = forms.HiddenInput()

    def clean(self) -> dict[str, Any] | None:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            schedule = schedule_of(data["kind"], data["expression"], data.get("tz") or "")
            if data["kind"] not in ("cron", "crontab") and (data.get("tz") or "").strip():
                raise ConfigurationError("schedule: tz goes with cron and crontab only")
            ScheduleSpec.parse(schedule)
            data["schedule"] = schedule
            data["definition"] = EntryDefinition.of(
                data["task"], schedule, data.get("args") or "[]", data.get("kwargs") or "{}",
                data.get("options") or "{}", bool(data.get("enabled")))
        except ConfigurationError as exc:
            where, text = field_of(exc)
            if where not in self.fields:
                where = None
            self.add_error(where, text)
        return data
