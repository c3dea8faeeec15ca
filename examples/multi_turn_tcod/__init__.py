"""TCOD multi-turn on-policy distillation example: environments, demo and GPU run scripts."""
