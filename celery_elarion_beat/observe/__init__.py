"""What happened, told: outcomes, Celery events, Prometheus metrics and their
exporter, JSON log lines, and the schedule fingerprints behind the drift alarm."""
