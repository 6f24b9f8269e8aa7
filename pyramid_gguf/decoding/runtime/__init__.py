"""What a generation runs through: the loaded tiers (:mod:`.tiers`), proposers (:mod:`.protocol`,
:mod:`.proposers`, :mod:`.ngram`), one verification (:mod:`.stage`, with the pure rules of
:mod:`.acceptance` and :mod:`.sampling`), rounds (:mod:`.rounds`, :mod:`.auto`), one
sequence's state and steps (:mod:`.sequence`), the engine (:mod:`.engine`), statistics
(:mod:`.stats`) and the cost curves' measurement (:mod:`.calibrate`)."""
