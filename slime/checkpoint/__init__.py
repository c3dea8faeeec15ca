"""The driver's checkpoints: writing and restoring them, finding the one ``--load`` names, and the resume checks.

* ``files``       checksums.json per checkpoint, and readers whose errors name the file (also used by the
                  trainers' own checkpoint code in ``slime/backends``)
* ``layout``      ``iter_XXXXXXX`` folders and ``latest_checkpointed_iteration.txt``: which iteration ``--load``
                  resumes, verified, falling back to the newest intact one
* ``run_config``  ``run_config.json``: the run's flags, so a resume can be compared with them
* ``driver``      ``save_checkpoint`` / ``load_checkpoint``: the atomic write and the restore (``train.py``)
* ``resume``      what a ``--load`` resumes and what a resume may not change (called before Ray by ``slime.launch``)

This package sits above ``slime/arguments`` and ``slime/utils`` and below everything else: the trainers
(``slime/backends``) read checkpoint files through it and the pre-flight (``slime/launch``) checks resumes with
it, so it imports neither. State that belongs to a higher layer (the teacher-played episodes of
``slime.rollout.teacher_prefix``) is handed to ``save_checkpoint`` / ``load_checkpoint`` by the caller.
"""
