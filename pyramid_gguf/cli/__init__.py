"""The ``pyramid-gguf`` command line: one module per command group, wired in :mod:`.main`."""
