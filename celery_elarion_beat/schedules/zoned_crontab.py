"""``zoned_crontab``: Celery's ``crontab`` read in a time zone of its own.

Celery's ``crontab`` reads its fields in the app's ``timezone``. A database entry
(``{"crontab": "0 3 * * *", "tz": "America/New_York"}``) names its own zone, so it is
built as this subclass, whose ``tz`` is that zone and whose ``now()`` is read in it;
everything else (the field semantics, daylight saving time as
:func:`~.slots.crontab_slot` names the slots) is Celery's ``crontab``.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab

__all__ = ["zoned_crontab"]


class zoned_crontab(crontab):  # noqa: N801 - named like celery's crontab
    """A ``crontab`` in the IANA time zone *tz* (a name such as ``"Europe/Berlin"``)."""

    def __init__(self, minute: Any = "*", hour: Any = "*", day_of_week: Any = "*",
                 day_of_month: Any = "*", month_of_year: Any = "*", tz: str = "UTC",
                 **kwargs: Any) -> None:
        self.zone_name = str(tz)
        self._zone: tzinfo = ZoneInfo(self.zone_name)
        super().__init__(minute, hour, day_of_week, day_of_month, month_of_year, **kwargs)

    @property
    def tz(self) -> tzinfo:
        return self._zone

    def now(self) -> datetime:
        moment: datetime = (self.nowfun or self.app.now)()
        return moment.astimezone(self._zone)

    def __reduce__(self) -> Any:
        return (self.__class__, (self._orig_minute, self._orig_hour, self._orig_day_of_week,
                                 self._orig_day_of_month, self._orig_month_of_year,
                                 self.zone_name))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, zoned_crontab):
            return super().__eq__(other) is True and self.zone_name == other.zone_name
        if isinstance(other, crontab):
            return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._orig_minute, self._orig_hour, self._orig_day_of_week,
                     self._orig_day_of_month, self._orig_month_of_year, self.zone_name))

    def __repr__(self) -> str:
        return (f"<zoned_crontab: {self._orig_minute} {self._orig_hour} "
                f"{self._orig_day_of_month} {self._orig_month_of_year} "
                f"{self._orig_day_of_week} {self.zone_name}>")
