"""Multi-turn on-policy distillation with TCOD's temporal curriculum: agent loop, gridnav env, launch script."""
