"""The foundation every layer may use, with no llama.cpp and no numpy: errors, configs, the mode
table, ladder shapes, model files and GGUF headers, text streaming.

- :mod:`.errors`: :class:`~.errors.UserError` and its kinds (one line, exit 1, HTTP 400).
- :mod:`.load`, :mod:`.sampling`, :mod:`.spec`: the frozen configs (how a file loads, how tokens
  are sampled, which mode and knobs decode); :mod:`.home`: the cache home.
- :mod:`.modes`: the mode table; :mod:`.ladder`: tier names, :class:`~.ladder.LadderPaths`,
  :class:`~.ladder.LadderShape` (and the one answer to "can this ladder run this mode").
- :mod:`.files`, :mod:`.gguf_header`: path checks, JSON files, GGUF headers.
- :mod:`.textstream`: UTF-8-safe text deltas with stop strings.
"""
