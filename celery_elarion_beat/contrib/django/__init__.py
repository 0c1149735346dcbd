"""celery-elarion-beat for Django: add ``"celery_elarion_beat.contrib.django"`` to
``INSTALLED_APPS``.

* **The admin** (:mod:`.admin`) lists the database entries of the live schedules
  (``elarion_beat_db_entries``) and adds, edits, enables, disables and removes them
  through :mod:`celery_elarion_beat.live_schedules`, as the CLI does: the revision
  read is the conflict token (a stale form is refused, the conflict shown), the
  admin user is the actor, a reason is required, the revision history is the audit,
  and on PostgreSQL the nodes hear of each change at once. It reads the entries
  table through an unmanaged model (:mod:`.models`) and never writes it through the
  ORM. The change view shows the entry's next occurrences.
* **The way in from django-celery-beat** (:mod:`.importer`, :mod:`.convert`):
  ``celery -A proj elarion-beat schedule import-django`` converts its
  ``PeriodicTask`` rows (:mod:`.command`).

:mod:`.binding` finds the Celery app and the claims database from Django.
"""
