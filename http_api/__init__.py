"""The OpenAI-compatible HTTP API: a client of the orchestrator's gRPC service (`http_api.app`)."""
