"""Serving on top of the Python API (:mod:`pyramid_gguf.api`): OpenAI-shaped bodies, request
schemas, the job queue and the OpenAI-compatible HTTP server."""
