"""Analysis over recorded answers: acceptance traces (:mod:`.traces`), any mode's rounds replayed
over scripted tiers and priced by cost curves (:mod:`.replay`), and the most any n-gram drafter
could gain on an answer (:mod:`.bound`)."""
