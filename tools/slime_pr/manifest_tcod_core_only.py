"""The TCOD PR's other path: the small core part alone, the example staying in its standalone repository.

``port.py --pr tcod-core-only`` adds only ``get_current_rollout_id()`` beside upstream's ``set_current_rollout_id``
in ``slime/rollout/sample_hooks.py`` (the one core change the example needs: its agent loop reads the rollout step
there) and one test of it in upstream's ``tests/test_rollout_sample_hooks.py``, which ``cpu-unittest`` already runs.
The example, the ``--tcod-*`` flags and the schedule stay in this repository, which slime's README would link.
Nothing is copied; ``verify.sh --pr tcod-core-only`` proves it as it proves the full PR (port, CPU CI, the PR checks).
"""

from __future__ import annotations

from tools.slime_pr.manifest import GETTER_ANCHOR, SAMPLE_HOOKS, TEMPLATE, edit_sample_hooks
from tools.slime_pr.manifest import VERIFIED_COMMIT  # noqa: F401 - port.py reads it from every manifest

AUTHOR = "slime-tcod"
SPLICED: tuple[str, ...] = ()
COPIED_FILES: tuple[str, ...] = ()
SOURCES: dict[str, str] = {}
TEST = "tests/test_rollout_sample_hooks.py"  # upstream's, registered in cpu-unittest
CPU_TEST_FILES = (TEST,)
GPU_TEST_FILE = None
GPU_REGISTRATION: tuple[tuple[str, int], ...] = ()
TEST_FILES = CPU_TEST_FILES
CAPS = {"core": 5, "added": 30, "removed": 1}  # the getter; the test's import line is replaced, not dropped
UNCOUNTED: tuple[str, ...] = ()
REGISTERED = "{'test_file': 'test_rollout_sample_hooks.py', 'num_gpus': 0},"

IMPORT = "from slime.rollout.sample_hooks import apply_rollout_sample_hooks, set_current_rollout_id\n"
NEW_IMPORT = (
    "from slime.rollout.sample_hooks import apply_rollout_sample_hooks, get_current_rollout_id, "
    "set_current_rollout_id\n"
)
RUNNER = '\n\nif __name__ == "__main__":\n'
# A hook reads the id both ways: the keyword argument apply_rollout_sample_hooks passes, and the getter a generate
# function (which gets no rollout id) would call. A getter that returned anything but the id set fails it.
NEW_TEST = '''

def getter_hook(args, sample, *, rollout_id=None):
    sample.metadata["ids"] = (rollout_id, get_current_rollout_id())


@pytest.mark.unit
def test_get_current_rollout_id_returns_the_id_rollout_manager_set():
    args = types.SimpleNamespace(rollout_sample_hook_path=[f"{__name__}.getter_hook"])
    try:
        for rollout_id in (3, 4, None):
            set_current_rollout_id(rollout_id)

            sample = asyncio.run(apply_rollout_sample_hooks(args, Sample(index=0, metadata={})))

            assert sample.metadata["ids"] == (rollout_id, rollout_id)
    finally:
        set_current_rollout_id(None)
'''

EXPECTED = (
    (SAMPLE_HOOKS, GETTER_ANCHOR, "the current rollout id the getter returns"),
    ("slime/ray/rollout.py", "set_current_rollout_id(rollout_id)", "RolloutManager sets the current rollout id"),
    (TEST, IMPORT.split(", ")[0], "the test file the getter's test joins"),
    (TEST, RUNNER.strip(), "the test file's runner, which the new test goes before"),
    (TEMPLATE, REGISTERED, "the test file is registered in cpu-unittest"),
)
COMMITS = (
    ("[TCOD] Add get_current_rollout_id() beside set_current_rollout_id()", [SAMPLE_HOOKS, TEST]),
)


def edit_test(source: str) -> str:
    if "def test_get_current_rollout_id_" in source:
        return source
    source = source.replace(IMPORT, NEW_IMPORT, 1)
    at = source.rindex(RUNNER)
    return source[:at] + NEW_TEST.rstrip("\n") + "\n" + source[at:]


def edits(slime_dir) -> dict[str, str]:
    text = lambda rel: (slime_dir / rel).read_text()  # noqa: E731
    return {SAMPLE_HOOKS: edit_sample_hooks(text(SAMPLE_HOOKS)), TEST: edit_test(text(TEST))}
