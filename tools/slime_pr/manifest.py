"""The multi-turn TCOD pull request: which files of this repository it carries and how it edits upstream's.

Every path of ``COPIED_FILES`` lands at the same path upstream. ``slime/utils/tcod_arguments.py`` is spliced, not
copied: ``add_tcod_arguments`` becomes a group nested in upstream's ``get_slime_extra_args_provider`` right after the
on-policy-distillation group (and registered after it), the body of ``validate_tcod_args`` an inline ``if`` block of
``slime_validate_args`` right after the ``--custom-config-path`` YAML (which sets ``max_turns``) is applied. ``edits``
also adds ``get_current_rollout_id()`` beside upstream's ``set_current_rollout_id`` (the agent loop reads the step
there), the example to ``examples/README.md``, and the tests to upstream's CI template (the GPU e2e test once per
configuration, the CPU tests in ``cpu-unittest``). The walkthrough is the example's README, as for upstream's other
multi-turn examples (none has a docs page). ``port.py`` applies it; ``manifest_tcod_core_only.py`` is the other path
(the getter alone, the example linked from its standalone repository).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERIFIED_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"  # the upstream commit whose APIs the PRs use
AUTHOR = "slime-tcod"  # of the commits port.py makes in a git work tree

ARGUMENTS_SOURCE = "slime/utils/tcod_arguments.py"  # spliced into upstream's arguments.py, not copied
SPLICED = (ARGUMENTS_SOURCE,)  # this repository's files the PR carries other than by copy (linted all the same)
CORE_FILES = ("slime/rollout/tcod.py",)
EXAMPLE_FILES = tuple(f"examples/multi_turn_tcod/{name}" for name in (
    "README.md", "__init__.py", "run-qwen3-8B-tcod.sh", "multi_turn_tcod_config.yaml", "rollout.py", "chat_layout.py",
    "metrics.py", "envs/__init__.py", "envs/gridnav.py", "envs/make_data.py"))
# Tests that need no GPU (NUM_GPUS = 0): upstream's `cpu-unittest` job runs each as `python tests/FILE` on
# Python 3.10 without sglang or Megatron (cpu_ci.py runs them so).
CPU_TEST_FILES = ("tests/test_tcod_arguments.py", "tests/test_tcod_rollout.py", "tests/test_tcod_e2e_cpu.py")
GPU_TEST_FILE = "tests/test_qwen3_0.6B_tcod.py"
TEST_FILES = (*CPU_TEST_FILES, GPU_TEST_FILE)
COPIED_FILES = CORE_FILES + EXAMPLE_FILES + TEST_FILES
SOURCES: dict[str, str] = {}  # every copied file lives at its upstream path here
# verify_pr.py's caps (issue 30): added lines under slime/ and in all, the example's Python.
CAPS = {"core": 150, "added": 2500, "example_py": 823, "removed": 5}  # 823: geo3k_vlm_multi_turn's Python
UNCOUNTED: tuple[str, ...] = ()  # every added line counts towards CAPS["added"]
EXAMPLE_DIR = "examples/multi_turn_tcod/"


class PortError(ValueError):
    """SLIME_DIR is not the upstream tree this PR was written for."""


# ---------------------------------------------------------------------------- upstream's CI template
TEMPLATE = ".github/workflows/pr-test.yml.j2"  # rendered into pr-test.yml by upstream's generator
RENDERED = ".github/workflows/pr-test.yml"
GENERATOR = ".github/workflows/generate_github_workflows.py"
ANCHOR = "{'test_file': 'test_qwen2.5_0.5B_opd_sglang.py', 'num_gpus': 8},"  # the OPD test the GPU test extends
TEST_FILE = GPU_TEST_FILE.removeprefix("tests/")
# (tcod mode, teacher type, GPUs): one entry per teacher mode, each mode of the curriculum once. The sglang
# teacher serves on a GPU of its own beside the 2 the colocated actor and engines train on; the Megatron teacher
# lives in the actor. The file's NUM_GPUS (read by upstream's changed-tests job, which runs it without
# test_args) is the first configuration's.
GPU_CONFIGS = (("b2f", "sglang", 3), ("f2b", "megatron", 2))
GPU_ENTRIES = tuple(f"{{'test_file': '{TEST_FILE}', 'test_args': '--tcod-mode {mode} --opd-type {opd}', "
                    f"'num_gpus': {gpus}}}," for mode, opd, gpus in GPU_CONFIGS)
# (test_args, GPUs) of each GPU entry, as verify_pr.py finds them in the rendered jobs.
GPU_REGISTRATION = tuple((f"--tcod-mode {m} --opd-type {o}", n) for m, o, n in GPU_CONFIGS)
CPU_JOB_LINE = "'cpu-unittest': {"  # the CPU job that installs transformers
CPU_ENTRIES = tuple(f"{{'test_file': '{rel.removeprefix('tests/')}', 'num_gpus': 0}}," for rel in CPU_TEST_FILES)
ENTRIES = GPU_ENTRIES + CPU_ENTRIES
_NAMES = tuple(f"'{rel.removeprefix('tests/')}'" for rel in TEST_FILES)


def _only_line(lines: list[str], text: str, what: str) -> int:
    found = [i for i, line in enumerate(lines) if line.strip() == text]
    if len(found) != 1:
        raise PortError(f"{TEMPLATE}: {what} {text!r} is there {len(found)} times, not once")
    return found[0]


def _cpu_list_end(lines: list[str]) -> int:
    """Index of the `],` that closes the cpu-unittest job's 'tests' list."""
    start = _only_line(lines, CPU_JOB_LINE, "the job line")
    tests = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == "'tests': ["), None)
    end = tests and next((i for i in range(tests + 1, len(lines)) if lines[i].strip() == "],"), None)
    if end is None or any(line.strip().endswith("{") for line in lines[tests + 1 : end]):
        raise PortError(f"{TEMPLATE}: the cpu-unittest job's 'tests' list is not where expected")
    return end


def edit_template(text: str) -> str:
    """The template with the PR's entries once each: every line naming a PR test is dropped, then the GPU entries
    go right after the OPD test's and the CPU entries at the end of the CPU job's list (a rerun changes nothing)."""
    lines = [line for line in text.splitlines(keepends=True) if not any(n in line for n in _NAMES)]
    anchor = _only_line(lines, ANCHOR, "the OPD test's entry")
    end = _cpu_list_end(lines)
    indent = lambda line: line[: len(line) - len(line.lstrip())]  # noqa: E731
    # Bottom-up, so that the first insertion leaves the second's index valid.
    for at, pad, entries in sorted([(anchor + 1, indent(lines[anchor]), GPU_ENTRIES),
                                    (end, indent(lines[end - 1]), CPU_ENTRIES)], reverse=True):
        lines[at:at] = [f"{pad}{entry}\n" for entry in entries]
    return "".join(lines)


# ---------------------------------------------------------------------------- arguments.py
ARGS = "slime/utils/arguments.py"
PROVIDER, INNER = "get_slime_extra_args_provider", "add_slime_arguments"
GROUP_AFTER = "add_on_policy_distillation_arguments"
GROUP, VALIDATE = "add_tcod_arguments", "validate_tcod_args"  # the two functions of ARGUMENTS_SOURCE
GROUP_INDENT = " " * 8  # a top-level def of tcod_arguments.py becomes a def nested in add_slime_arguments
REGISTER_ANCHOR = "        parser = add_on_policy_distillation_arguments(parser)\n"
REGISTER_LINE = "        parser = add_tcod_arguments(parser)\n"
VALIDATE_FLAG = "use_tcod"  # the inlined block is the top-level `if` of slime_validate_args that tests it
# Upstream keeps the current rollout id (set by RolloutManager) but has no public getter for it.
SAMPLE_HOOKS = "slime/rollout/sample_hooks.py"
GETTER_ANCHOR = (
    "def set_current_rollout_id(rollout_id: int | None) -> None:\n"
    "    global _current_rollout_id\n"
    "    _current_rollout_id = rollout_id\n"
)
GETTER = (
    "\n\ndef get_current_rollout_id() -> int | None:\n"
    '    """The rollout id RolloutManager.generate / eval set last in this process, for code that is not passed it."""\n'
    "    return _current_rollout_id\n"
)
EXAMPLES_README = "examples/README.md"
EXAMPLES_ANCHOR = "- **[multi_agent](./multi_agent)**"  # the list is alphabetical
EXAMPLES_LINE = (
    "- **[multi_turn_tcod](./multi_turn_tcod)**: Multi-turn on-policy distillation of text agents with TCOD's "
    "temporal curriculum (front-to-back or back-to-front trajectory depth).\n"
)

# What the PR relies on in upstream's tree: (file, text that must be there, why).
EXPECTED = (
    (ARGS, "def get_slime_extra_args_provider(", "the argument groups"),
    (ARGS, f"        def {GROUP_AFTER}(parser):", "the nested group the --tcod-* group follows"),
    (ARGS, REGISTER_ANCHOR.strip(), "where the --tcod-* group is registered"),
    (ARGS, "def slime_validate_args(args):", "where the --tcod-* flags are validated"),
    (ARGS, "if args.custom_config_path:", "the YAML that sets max_turns before validation"),
    (SAMPLE_HOOKS, GETTER_ANCHOR, "the current rollout id, which the curriculum reads"),
    ("slime/ray/rollout.py", "set_current_rollout_id(rollout_id)", "RolloutManager sets the current rollout id"),
    ("slime/rollout/sglang_rollout.py", "def generate_rollout(", "the default rollout that calls the agent loop"),
    ("slime/rollout/sglang_rollout.py", "class GenerateState", "the agent loop's tokenizer and abort state"),
    ("slime/rollout/sglang_rollout.py", "if sample.reward is None:", "the reward model runs only for reward None"),
    ("slime/rollout/on_policy_distillation.py", "def post_process_rewards(", "upstream's OPD hooks"),
    ("slime/observability/rollout_metrics.py", "custom_rollout_log_function_path", "the rollout-log hook"),
    ("slime/utils/types.py", "class Status(Enum):", "Sample.Status"),
    ("slime/utils/types.py", "remove_sample: bool = False", "upstream's way to drop samples"),
    ("slime/utils/http_utils.py", "async def post(url, payload, max_retries=60, headers=None):", "http_utils.post"),
    ("slime/utils/misc.py", "def load_function(", "plugin loading"),
    ("examples/geo3k_vlm_multi_turn/rollout.py", "def _load_env_module(", "the env loader the agent loop reuses"),
    (EXAMPLES_README, EXAMPLES_ANCHOR, "the examples list"),
    (TEMPLATE, ANCHOR, "where the GPU test is registered"),
    (TEMPLATE, CPU_JOB_LINE, "the CPU job the CPU tests are registered in"),
)

# The commit series: (message, paths).
COMMITS = (
    ("[TCOD] Add --tcod-* arguments, the temporal-curriculum schedule and get_current_rollout_id()",
     [ARGS, SAMPLE_HOOKS, *CORE_FILES]),
    ("[TCOD] Add examples/multi_turn_tcod: multi-turn agent rollout with TCOD's curriculum",
     [*EXAMPLE_FILES, EXAMPLES_README]),
    ("[TCOD] Add CPU tests and a GPU e2e test for multi-turn TCOD", [*TEST_FILES, TEMPLATE, RENDERED]),
)


def _function(body, name: str):
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def spliced_text() -> tuple[list[str], list[str]]:
    """(the nested group's lines, the validation block's lines), from this repository's tcod_arguments.py."""
    source = (REPO / ARGUMENTS_SOURCE).read_text()
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    group, validate = _function(tree.body, GROUP), _function(tree.body, VALIDATE)
    if group is None or validate is None:
        raise PortError(f"{ARGUMENTS_SOURCE} must define {GROUP}(parser) and {VALIDATE}(args)")
    group_lines = [GROUP_INDENT + x if x.strip() else x for x in lines[group.lineno - 1 : group.end_lineno]]
    # The body after the docstring, comments included; it is already at slime_validate_args' indentation.
    first = validate.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str)
    start = first.end_lineno if docstring else validate.lineno
    return group_lines, lines[start : validate.end_lineno]


def _anchors(source: str):
    """(nested OPD group's parent, the OPD group, `if args.custom_config_path:` block, slime_validate_args)."""
    tree = ast.parse(source)
    provider = _function(tree.body, PROVIDER)
    inner = provider and _function(provider.body, INNER)
    after = inner and _function(inner.body, GROUP_AFTER)
    if after is None:
        raise PortError(f"{ARGS}: no {GROUP_AFTER} nested in {PROVIDER}().{INNER}()")
    validate = _function(tree.body, "slime_validate_args")
    block = validate and next(
        (n for n in validate.body if isinstance(n, ast.If) and "custom_config_path" in ast.unparse(n.test)), None
    )
    if block is None:
        raise PortError(f"{ARGS}: slime_validate_args has no top-level `if args.custom_config_path:` block")
    return inner, after, block, validate


def remove_splice(source: str) -> str:
    """Upstream's arguments.py without a previous splice, so a newer one replaces it and a rerun changes nothing."""
    inner, _, _, validate = _anchors(source)
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()  # 0-based line indices
    group = _function(inner.body, GROUP)
    if group is not None:  # the def and the blank line the splice put before it
        drop.update(range(group.lineno - 2, group.end_lineno))
    block = next((n for n in validate.body if isinstance(n, ast.If) and VALIDATE_FLAG in ast.unparse(n.test)), None)
    if block is not None:  # the block, its comment lines and the blank line before them
        start = block.lineno - 1
        while lines[start - 1].lstrip().startswith("#"):
            start -= 1
        drop.update(range(start - 1, block.end_lineno))
    drop.update(i for i, line in enumerate(lines) if line == REGISTER_LINE)
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def edit_arguments(source: str) -> str:
    source = remove_splice(source)
    _, after, block, _ = _anchors(source)
    group_lines, validate_lines = spliced_text()
    lines = source.splitlines(keepends=True)
    register = lines.index(REGISTER_ANCHOR) + 1
    # Bottom-up, so that each insertion leaves the earlier line numbers valid.
    edits = sorted([(block.end_lineno, ["\n", *validate_lines]), (register, [REGISTER_LINE]),
                    (after.end_lineno, ["\n", *group_lines])], reverse=True)
    for at, new in edits:
        lines[at:at] = new
    source = "".join(lines)
    ast.parse(source)  # never write a file that does not parse
    return source


def edit_sample_hooks(source: str) -> str:
    if "def get_current_rollout_id(" in source:
        return source
    return source.replace(GETTER_ANCHOR, GETTER_ANCHOR + GETTER, 1)


def _insert_after(source: str, anchor: str, line: str) -> str:
    if line in source:
        return source
    end = source.index("\n", source.index(anchor.strip())) + 1
    return source[:end] + line + source[end:]


def edits(slime_dir: Path) -> dict[str, str]:
    """The new text of every upstream file the PR edits (port.py keeps those that differ)."""
    text = lambda rel: (slime_dir / rel).read_text()  # noqa: E731
    new = {ARGS: edit_arguments(text(ARGS)), SAMPLE_HOOKS: edit_sample_hooks(text(SAMPLE_HOOKS))}
    new[EXAMPLES_README] = _insert_after(text(EXAMPLES_README), EXAMPLES_ANCHOR, EXAMPLES_LINE)
    new[TEMPLATE] = edit_template(text(TEMPLATE))
    return new
