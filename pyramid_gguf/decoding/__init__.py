"""The engine, in three parts that import downward only:

- :mod:`.pricing`: what ``auto`` decides with (chains and their prices, the policy, keep-rate
  estimates, cost curves). Pure Python and numpy.
- :mod:`.runtime`: what a generation calls (one round: the round runner, the proposers, the
  verification rules, ``auto``'s scheduler; beneath them the tiers, the n-gram index, sampling
  and the grammar; the engine, statistics, parallel slots, calibration).
- :mod:`.offline`: analysis over recorded answers (acceptance traces, replays, copy bounds).
"""
