"""Flower configuration that adds celery-elarion-beat's page and metrics to Flower.

    celery -A proj flower --conf=flowerconfig.py

Flower runs this file as Python before it builds its web application; the
import below adds, in that same Flower process:

* /elarion: the beat cluster's occurrences (who won each one, who skipped it
  and why, per-node counts), refreshed live; its data is /elarion/api/state;
* elarion_beat_occurrences_total{job,outcome,reason} (per job) and
  elarion_beat_node_occurrences_total{node,outcome,reason} (per node) on Flower's /metrics.

Both pages follow Flower's url_prefix and authentication. Every other Flower
option can be set here as usual (command-line options win over this file).
"""

import celery_elarion_beat.flower  # noqa: F401  (adds /elarion and the elarion_beat_* metrics)

# Flower's own options, as usual, for example:
# port = 5555
# url_prefix = "flower"
# basic_auth = ["admin:change-me"]
