"""slime-shaped on-policy distillation for multi-turn agents, with TCOD's temporal curriculum."""

__version__ = "0.1.0"
