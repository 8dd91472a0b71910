"""Hardware health: readings, incidents, failure metrics and drain suggestions (docs/health.md)."""
