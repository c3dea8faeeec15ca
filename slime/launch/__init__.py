"""Everything ``train.py`` does between the parsed arguments and Ray, behind one entry: ``prepare.prepare_run``.

* ``checks``        the checks ``--dry-run`` runs too; each refusal names its flag, defaults taken are noted
                    (``plugin_paths``, ``url_checks``, ``config_keys``, ``output_paths``, ``task_envs`` with
                    ``task_rows``, ``data_overlap``, ``resume_notes``)
* ``plan``          the resolved plan ``--dry-run`` prints, with ``memory_plan``'s per-device estimate
* ``preflight``     real runs only: model folders and shape, prompt files with the tokenizer, the teacher's
                    vocabulary, the verified ``--load`` iteration
* ``prepare``       the entry: the above in order, the output folders' lock, the exit codes

The top layer under ``train.py``: it may import every package of ``slime`` and none imports it.
"""
