"""What a generation runs through.

One round, in four files here and :mod:`..pricing.chains`: :mod:`.rounds` (``RoundRunner``: one
round of any chain, plain decoding included; the ``Scheduler`` of a fixed mode), :mod:`.proposers`
(the ``Proposer`` protocol: a draft model, the n-gram drafter, a qualified stage),
:mod:`.verification` (one verification in one batch, and the acceptance rules, pure numpy) and
:mod:`.auto` (``auto``'s choice of a chain each round). Beneath them: the loaded tiers
(:mod:`.tiers`), the n-gram index (:mod:`.ngram`), the sampling warp (:mod:`.sampling`), one
sequence's grammar (:mod:`.guide`). Around them: one sequence's state and steps
(:mod:`.engine`), statistics (:mod:`.stats`), parallel slots (:mod:`.slots`, :mod:`.batcher`)
and the cost curves' measurement (:mod:`.calibrate`).
"""
