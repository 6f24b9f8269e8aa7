"""The engine, in three parts that import downward only:

- :mod:`.pricing`: what ``auto`` decides with (chains and their prices, the policy, keep-rate
  estimates, cost curves). Pure Python and numpy.
- :mod:`.runtime`: what a generation calls (tiers, proposers, verification and acceptance,
  sampling, rounds, ``auto``'s scheduler, the engine, calibration).
- :mod:`.offline`: analysis over recorded answers (acceptance traces, replays, copy bounds).
"""
