"""OpenAI-compatible HTTP API of the router (chat completions, completions, models)."""
