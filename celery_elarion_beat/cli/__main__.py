"""``python -m celery_elarion_beat.cli``: say how to run the commands."""

from . import main

main()
