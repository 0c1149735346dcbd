"""``Celery("svc_a")``: one of the two apps of :mod:`.test_two_apps` (:mod:`.proj_two_apps`)."""

from __future__ import annotations

import os

from tests.acceptance.proj_two_apps import make_app

app = make_app("svc_a", os.environ)
