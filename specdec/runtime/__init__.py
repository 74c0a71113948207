"""What the servers share: start-up, settings as flags, guards, security, telemetry, the wire, Redis state."""
