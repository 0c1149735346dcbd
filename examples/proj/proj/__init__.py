"""An example project that runs celery-elarion-beat on every node."""

from .celery import app as celery_app

__all__ = ["celery_app"]
