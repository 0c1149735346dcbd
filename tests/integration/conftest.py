"""Fixtures of the integration tests: the Django test project
(tests/integration/django_project.py)."""

from __future__ import annotations

from tests.integration.django_project import (  # noqa: F401 - fixtures
    django_databases,
    django_project,
    django_setup,
)
