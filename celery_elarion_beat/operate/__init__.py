"""The library under the CLI and the Flower page: status and reconciliation, the
schedule preview, the catch-up preview, live control (pause, resume, trigger)."""
