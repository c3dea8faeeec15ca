"""This runtime's stand-in for upstream's ``examples/geo3k_vlm_multi_turn``: only what the TCOD example reuses."""
