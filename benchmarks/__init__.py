"""Benchmarks of celery-elarion-beat against real PostgreSQL and Redis.

Run everything with ``python -m benchmarks`` (full mode, writes
``docs/benchmarks.md`` and ``docs/img/*.png``) or ``python -m benchmarks --smoke``
(tiny sizes, well under a minute, writes nowhere in the repository). See
``python -m benchmarks --help`` and docs/benchmarks.md.

Results are measurements, never assertions: the smoke test only checks that
the scripts still run and print their tables.
"""
