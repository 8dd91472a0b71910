"""sing: telemetry, accounting and trace analytics for shared campus GPU clusters."""
