"""Test helpers: a cuttable TCP proxy and real celery subprocesses."""
