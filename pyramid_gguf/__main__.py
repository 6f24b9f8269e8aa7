"""``python -m pyramid_gguf``: the same CLI as ``pyramid-gguf``."""

from .cli.main import main

main()
