"""Serving: the :class:`~.api.Pyramid` Python API, streaming text, OpenAI-shaped bodies and the
OpenAI-compatible HTTP server."""
