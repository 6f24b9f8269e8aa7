"""Planning a ladder for a machine: cost curves of placements composed from device profiles,
and placements ranked by replaying acceptance traces through them."""
