"""Flower: who may press the Beat page's buttons (pause, resume, run now).

Flower 2 turns its own API off when it has no authentication, unless the operator
sets ``FLOWER_UNAUTHENTICATED_API=true``; its basic auth and OAuth have no roles. The
page follows the same rule, and adds one list. For each caller, in this order:

1. ``elarion_beat_flower_actions`` is False: nobody (:data:`READ_ONLY`).
2. Flower has no authentication (neither ``--basic_auth`` nor ``--auth``): nobody
   (:data:`NO_AUTHENTICATION`), unless ``FLOWER_UNAUTHENTICATED_API`` is true (read as
   Flower reads it: its handlers' ``unauthenticated_api``, else the environment), or
   a Flower that defines an ``unauthenticated_api`` option has it set. Even then,
   nobody while ``elarion_beat_flower_operators`` is set (:data:`NOBODY_MATCHES`): an
   anonymous caller cannot be matched against a list of users.
3. Flower has authentication: every user it lets in when
   ``elarion_beat_flower_operators`` is empty; else only a user whose basic-auth name
   (exactly, as Flower compares it) or OAuth e-mail address (whatever its case)
   matches one of its glob patterns (:func:`fnmatch.fnmatchcase`). Everyone else may
   watch (:func:`not_an_operator`); the refusal names the setting, not its patterns.

The Schedule card's edit form (:mod:`.schedule`) follows the same rule once it is on
(``elarion_beat_flower_edit`` and ``elarion_beat_db_entries``; else :data:`EDIT_OFF`,
:data:`NO_DB_ENTRIES`): :func:`edit_refusal`.

Every write endpoint of the page checks this before it reads its form or touches the
claims database (:class:`.controls.ActionHandler`); ``GET /elarion/api/controls`` tells
the page the answer (``actions``, ``actions_reason``), so the buttons show disabled
with the reason. The caller's name is also what the audit records (:attr:`Caller.actor`).
"""

from __future__ import annotations

import binascii
import os
from base64 import b64decode
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["EDIT_OFF", "NOBODY_MATCHES", "NO_AUTHENTICATION", "NO_DB_ENTRIES", "OPEN_API_ENV",
           "READ_ONLY", "Caller", "actor_of", "caller_of", "edit_refusal", "not_an_operator",
           "refusal", "unauthenticated_api"]

#: Flower's switch that opens its API (and so these actions) without authentication.
OPEN_API_ENV = "FLOWER_UNAUTHENTICATED_API"
#: Every refusal while ``elarion_beat_flower_actions`` is False.
READ_ONLY = ("this Flower is read-only: elarion_beat_flower_actions is False in its Celery "
             "configuration; use `celery -A proj elarion-beat pause|resume|trigger` instead")
#: The refusal of every caller of a Flower without authentication.
NO_AUTHENTICATION = (
    "this Flower has no authentication, so anyone who can reach it could pause or run "
    "jobs: its Beat actions are off, as Flower turns off its own API. Set up Flower's "
    "authentication (--basic_auth=user:password, or OAuth with --auth), or set "
    f"{OPEN_API_ENV}=true in Flower's environment to let anonymous callers act, as it "
    "does for Flower's API")
#: The refusal of every caller of a Flower opened with FLOWER_UNAUTHENTICATED_API while
#: ``elarion_beat_flower_operators`` is set.
NOBODY_MATCHES = (
    "elarion_beat_flower_operators is set, but this Flower has no authentication, so no "
    "caller can be matched against it and nobody may act (even with "
    f"{OPEN_API_ENV}=true): set up Flower's authentication (--basic_auth=user:password, "
    "or OAuth with --auth), or empty elarion_beat_flower_operators")
#: The refusal of every request of the edit form while ``elarion_beat_flower_edit`` is off.
EDIT_OFF = ("this Flower does not edit the schedule: elarion_beat_flower_edit is False in its "
            "Celery configuration; set it to True (or ELARION_BEAT_FLOWER_EDIT=true) to turn "
            "the edit form on, or use `celery -A proj elarion-beat schedule ...`")
#: The refusal of the edit form while the app keeps no database entries.
NO_DB_ENTRIES = ("the edit form changes the schedule's database entries, and "
                 "elarion_beat_db_entries is False in this Flower's Celery configuration: set "
                 "it to True (or ELARION_BEAT_DB_ENTRIES=true), as on the beat nodes")
_TRUE = {"y", "yes", "t", "true", "on", "1"}  # Flower's strtobool
_FALSE = {"n", "no", "f", "false", "off", "0"}


@dataclass(frozen=True)
class Caller:
    """Who sent a request to the page, and how Flower let them in."""

    #: the client's address (``anonymous@<address>`` without authentication)
    address: str
    #: the basic-auth user name, when Flower has ``--basic_auth``
    user: str | None = None
    #: the OAuth e-mail address Flower authenticated, when it has ``--auth``
    email: str | None = None
    #: Flower has authentication (basic or OAuth), so this caller passed it
    authenticated: bool = False
    #: Flower's API is open without authentication (``FLOWER_UNAUTHENTICATED_API``)
    open_api: bool = False

    @property
    def name(self) -> str | None:
        """The user name, else the e-mail address: how the refusals name the caller."""
        return self.user or self.email

    @property
    def actor(self) -> str:
        """What the audit records: ``bob (flower)``, ``anonymous@10.0.0.7 (flower)``."""
        return f"{self.name or f'anonymous@{self.address}'} (flower)"

    def matches(self, operators: Sequence[str]) -> bool:
        """Whether the user name (exactly) or the e-mail address (any case) matches one
        of the glob patterns *operators*."""
        if self.user and any(fnmatchcase(self.user, p) for p in operators):
            return True
        email = (self.email or "").lower()
        return bool(email) and any(fnmatchcase(email, p.lower()) for p in operators)


def refusal(caller: Caller, operators: Sequence[str], actions: bool = True) -> str | None:
    """Why *caller* may not act (None: they may); see the module for the rule.
    *actions* is ``elarion_beat_flower_actions``, *operators*
    ``elarion_beat_flower_operators``."""
    if not actions:
        return READ_ONLY
    if not caller.authenticated:
        if not caller.open_api:
            return NO_AUTHENTICATION
        return NOBODY_MATCHES if operators else None
    if operators and not caller.matches(operators):
        return not_an_operator(caller)
    return None


def edit_refusal(caller: Caller, operators: Sequence[str], actions: bool, edit: bool,
                 db_entries: bool) -> str | None:
    """Why *caller* may not use the edit form (None: they may): off unless *edit*
    (``elarion_beat_flower_edit``) and *db_entries* (``elarion_beat_db_entries``), then
    the rule of the buttons (:func:`refusal`)."""
    if not edit:
        return EDIT_OFF
    if not db_entries:
        return NO_DB_ENTRIES
    return refusal(caller, operators, actions)


def not_an_operator(caller: Caller) -> str:
    """The refusal of a user Flower lets in who is not in the operators list."""
    who = caller.name or "this user"
    return (f"{who} may watch this page but not act: only the users in "
            "elarion_beat_flower_operators may pause, resume or run jobs (or edit the "
            "schedule) here; to let "
            f"{who} act, add the name (or a glob pattern that matches it) to "
            "elarion_beat_flower_operators in this Flower's Celery configuration (or "
            "ELARION_BEAT_FLOWER_OPERATORS)")


def caller_of(handler: Any) -> Caller:
    """The caller of a Flower request handler, once Flower let it in (``@authenticated``)."""
    options = handler.application.options
    basic, oauth = bool(options.basic_auth), bool(options.auth)
    user = _basic_user(handler.request.headers.get("Authorization", "")) if basic else None
    email = None
    if oauth and handler.current_user:
        email = str(handler.current_user)
    return Caller(address=str(handler.request.remote_ip), user=user, email=email,
                  authenticated=basic or oauth, open_api=unauthenticated_api(handler))


def actor_of(handler: Any) -> str:
    """Who pressed the button: ``bob (flower)``, ``anonymous@10.0.0.7 (flower)``."""
    return caller_of(handler).actor


def unauthenticated_api(handler: Any) -> bool:
    """Whether this Flower opens its API without authentication: an
    ``unauthenticated_api`` option (where the running Flower defines one), else its
    handlers' ``unauthenticated_api`` (Flower 2.x: ``FLOWER_UNAUTHENTICATED_API``), else
    that environment variable. A value that is not a boolean counts as false."""
    try:
        if _flag(getattr(handler.application.options, "unauthenticated_api", None)):
            return True
        if isinstance(getattr(type(handler), "unauthenticated_api", None), property):
            return bool(handler.unauthenticated_api)
        return _flag(os.environ.get(OPEN_API_ENV))
    except ValueError:
        return False


def _flag(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE or not text:
        return False
    raise ValueError(f"{value!r} is not a boolean")


def _basic_user(header: str) -> str | None:
    scheme, _, credentials = header.partition(" ")
    if scheme != "Basic":
        return None
    try:
        decoded = b64decode(credentials.strip().encode(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0] or None
