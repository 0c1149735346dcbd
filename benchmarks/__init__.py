"""Benchmarks of celery-elarion-beat against real PostgreSQL and Redis.

Run everything with ``python -m benchmarks`` (full mode, writes
``benchmarks/results/full.json``, ``benchmarks/results/tables.md`` and
``docs/img/*.png``) or ``python -m benchmarks --smoke`` (tiny sizes, well under a
minute, writes nowhere in the repository). See ``python -m benchmarks --help``.
The code writes tables, plots and JSON; docs/benchmarks.md is written by hand.

Results are measurements, never assertions: the smoke test only checks that
the scripts still run and print their tables.
"""
