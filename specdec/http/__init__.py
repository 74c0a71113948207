"""The OpenAI-compatible HTTP API: a client of the orchestrator's gRPC service (`specdec.http.app`)."""
