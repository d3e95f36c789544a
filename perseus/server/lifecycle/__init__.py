"""A job's lifecycle, one module per step: creation and registration, the planning lease, policy
and stragglers, telemetry and savings."""
