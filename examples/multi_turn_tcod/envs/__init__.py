"""Text environments of the multi-turn TCOD example, in the ``build_env(sample, args)`` contract.

``gridnav`` (``rollout_interaction_env_path: examples.multi_turn_tcod.envs.gridnav``) needs no data
download: ``make_data`` writes its tasks, and every task knows its optimal path (TCOD's B2F prefix).
"""
