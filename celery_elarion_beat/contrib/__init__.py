"""Integrations with other frameworks, each in a folder of its own; the top floor of
the package (it may use every floor below, nothing below imports it).

* :mod:`.django`: a Django app whose admin edits the database entries (live
  schedules), and ``elarion-beat schedule import-django``, the way in from
  django-celery-beat.
"""
