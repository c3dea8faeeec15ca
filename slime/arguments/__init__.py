"""The command line's flag groups and their validation: the lowest layer, since every other layer reads args.

``slime/utils/arguments.py`` keeps slime's entry points (``parse_args``, ``get_parser``, ``validate_args``)
and the runtime's own groups, and imports the rest from here: the algorithm, Megatron and multi-turn groups,
the ``--custom-config-path`` YAML, the range checks, the parser class and ``ArgumentError``. Modules here
import only each other and ``slime/utils/tcod_arguments.py`` (the PR's group, which stays where slime
keeps it); ``tests/test_import_layers.py`` holds them to that.
"""
