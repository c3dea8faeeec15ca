"""Apply the multi-turn TCOD pull request to an upstream THUDM/slime checkout.

    python tools/slime_pr/port.py SLIME_DIR [--dry-run] [--no-commit]

* copies the PR's files (``manifest.COPIED_FILES``) to the same paths in SLIME_DIR;
* splices this repository's ``slime/utils/tcod_arguments.py`` into upstream's ``slime/utils/arguments.py``
  in upstream's own conventions: ``add_tcod_arguments`` becomes a group nested in
  ``get_slime_extra_args_provider`` right after the on-policy-distillation group (and registered after it),
  the body of ``validate_tcod_args`` an inline ``if`` block of ``slime_validate_args`` right after the
  ``--custom-config-path`` YAML is applied (it sets ``max_turns``);
* adds the public ``get_current_rollout_id()`` beside upstream's ``set_current_rollout_id`` in
  ``slime/rollout/sample_hooks.py`` (the agent loop reads the curriculum's step there);
* adds the docs page to both ``index.rst`` toctrees, the example to ``examples/README.md``, and registers
  the tests in ``.github/workflows/pr-test.yml.j2`` (``pr_test_entry.py``: the GPU e2e test once per
  configuration, the CPU tests in the ``cpu-unittest`` job; ``pr-test.yml`` re-rendered by upstream's
  generator).

Everything is computed before anything is written: a tree that is not upstream slime, or lacks an API
the PR relies on, is refused with one line naming what is missing, and nothing is changed. When
SLIME_DIR is a git work tree the change is committed as a short series (one commit per part); a second
run finds nothing to change and commits nothing.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.slime_pr import manifest  # noqa: E402
from tools.slime_pr import pr_test_entry  # noqa: E402

ARGS = "slime/utils/arguments.py"
# The --tcod-* group goes inside upstream's provider, beside its own nested groups, after the OPD group.
PROVIDER, INNER, GROUP_AFTER = "get_slime_extra_args_provider", "add_slime_arguments", "add_on_policy_distillation_arguments"
GROUP, VALIDATE = "add_tcod_arguments", "validate_tcod_args"  # the two functions of manifest.ARGUMENTS_SOURCE
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
GETTER = "\n\ndef get_current_rollout_id() -> int | None:\n    return _current_rollout_id\n"
DOC_ANCHOR = "   advanced/on-policy-distillation.md\n"
DOC_LINE = "   advanced/multi-turn-tcod.md\n"
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
    ("docs/en/index.rst", DOC_ANCHOR.strip(), "the docs toctree"),
    ("docs/zh/index.rst", DOC_ANCHOR.strip(), "the docs toctree"),
    (EXAMPLES_README, EXAMPLES_ANCHOR, "the examples list"),
    (pr_test_entry.TEMPLATE, pr_test_entry.ANCHOR, "where the GPU test is registered"),
    (pr_test_entry.TEMPLATE, pr_test_entry.CPU_JOB_LINE, "the CPU job the CPU tests are registered in"),
)

# The commit series: (message, paths). Paths not listed under an earlier commit go to the first that
# names their top folder.
COMMITS = (
    (
        "[TCOD] Add --tcod-* arguments, the temporal-curriculum schedule and get_current_rollout_id()",
        [ARGS, SAMPLE_HOOKS, *manifest.CORE_FILES],
    ),
    (
        "[TCOD] Add examples/multi_turn_tcod: multi-turn agent rollout with TCOD's curriculum",
        [*manifest.EXAMPLE_FILES, EXAMPLES_README],
    ),
    (
        "[TCOD] Add CPU tests and a GPU e2e test for multi-turn TCOD",
        [*manifest.TEST_FILES, pr_test_entry.TEMPLATE, pr_test_entry.RENDERED],
    ),
    ("[TCOD] Add the multi-turn TCOD docs page", [*manifest.DOC_FILES, "docs/en/index.rst", "docs/zh/index.rst"]),
)


class PortError(RuntimeError):
    """SLIME_DIR is not the upstream tree this PR was written for."""


def check_tree(slime_dir: Path) -> None:
    if not slime_dir.is_dir():
        raise PortError(f"{slime_dir} is not a directory")
    if slime_dir.resolve() == manifest.REPO:
        raise PortError("SLIME_DIR is this repository itself; point it at an upstream THUDM/slime checkout")
    for rel, needle, why in EXPECTED:
        path = slime_dir / rel
        if not path.is_file():
            raise PortError(f"{slime_dir} is not upstream slime as of {manifest.VERIFIED_COMMIT[:7]}: no {rel} ({why})")
        if needle not in path.read_text():
            raise PortError(f"{slime_dir}/{rel} lacks {needle!r} ({why}); this PR was written for {manifest.VERIFIED_COMMIT[:7]}")


# ---------------------------------------------------------------------------- arguments.py
def _function(body, name: str):
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _has_docstring(node) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def spliced_text() -> tuple[list[str], list[str]]:
    """(the nested group's lines, the validation block's lines), from this repository's tcod_arguments.py."""
    source = (manifest.REPO / manifest.ARGUMENTS_SOURCE).read_text()
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    group, validate = _function(tree.body, GROUP), _function(tree.body, VALIDATE)
    if group is None or validate is None:
        raise PortError(f"{manifest.ARGUMENTS_SOURCE} must define {GROUP}(parser) and {VALIDATE}(args)")
    group_lines = [GROUP_INDENT + x if x.strip() else x for x in lines[group.lineno - 1 : group.end_lineno]]
    # The body after the docstring, comments included; it is already at slime_validate_args' indentation.
    start = validate.body[0].end_lineno if _has_docstring(validate) else validate.lineno
    return group_lines, lines[start : validate.end_lineno]


def _anchors(source: str):
    """(nested OPD group, `if args.custom_config_path:` block, slime_validate_args) nodes of upstream's file."""
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
    at = source.index(anchor.strip())
    end = source.index("\n", at) + 1
    return source[:end] + line + source[end:]


# ---------------------------------------------------------------------------- the whole change
def planned_files(slime_dir: Path) -> dict[str, bytes]:
    """Every file the PR adds or edits, with its new content (only those that differ)."""
    new: dict[str, bytes] = {}
    absent = [rel for rel in manifest.COPIED_FILES if not (manifest.REPO / rel).is_file()]
    if absent:
        raise PortError(f"this repository lacks PR file(s) that manifest.py lists: {', '.join(absent)}")
    for rel in manifest.COPIED_FILES:
        new[rel] = (manifest.REPO / rel).read_bytes()
    new[ARGS] = edit_arguments((slime_dir / ARGS).read_text()).encode()
    new[SAMPLE_HOOKS] = edit_sample_hooks((slime_dir / SAMPLE_HOOKS).read_text()).encode()
    for index in ("docs/en/index.rst", "docs/zh/index.rst"):
        new[index] = _insert_after((slime_dir / index).read_text(), DOC_ANCHOR, DOC_LINE).encode()
    examples = (slime_dir / EXAMPLES_README).read_text()
    new[EXAMPLES_README] = _insert_after(examples, EXAMPLES_ANCHOR, EXAMPLES_LINE).encode()
    try:
        template = pr_test_entry.edit_template((slime_dir / pr_test_entry.TEMPLATE).read_text())
    except pr_test_entry.RegisterError as err:
        raise PortError(str(err)) from None
    new[pr_test_entry.TEMPLATE] = template.encode()
    return {rel: data for rel, data in new.items() if not (slime_dir / rel).is_file() or (slime_dir / rel).read_bytes() != data}


def write_changes(slime_dir: Path, changes: dict[str, bytes]) -> None:
    """Write the planned files; a changed CI template is re-rendered (``changes`` then names the rendered file)."""
    for rel, data in changes.items():
        (slime_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (slime_dir / rel).write_bytes(data)
    if pr_test_entry.TEMPLATE in changes and (slime_dir / pr_test_entry.GENERATOR).is_file():
        pr_test_entry.render(slime_dir)
        changes[pr_test_entry.RENDERED] = b""


def _git_work_tree(slime_dir: Path) -> bool:
    out = subprocess.run(["git", "-C", str(slime_dir), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return out.returncode == 0 and Path(out.stdout.strip()).resolve() == slime_dir.resolve()


def _commit(slime_dir: Path, changed: list[str]) -> list[str]:
    made, left = [], set(changed)
    for message, paths in COMMITS:
        part = [p for p in paths if p in left]
        if not part:
            continue
        left -= set(part)
        subprocess.run(["git", "-C", str(slime_dir), "add", "--", *part], check=True)
        subprocess.run(
            ["git", "-C", str(slime_dir), "-c", "user.name=slime-tcod", "-c", "user.email=slime-tcod@localhost",
             "commit", "-q", "-m", message, "--", *part],
            check=True,
        )
        made.append(message)
    if left:
        raise PortError(f"files outside the commit series: {sorted(left)}")
    return made


def port(slime_dir: Path, dry_run: bool = False, commit: bool = True) -> list[str]:
    slime_dir = slime_dir.resolve()
    check_tree(slime_dir)
    changes = planned_files(slime_dir)
    lines = [f"{'edit' if (slime_dir / rel).exists() else 'add':5s}{rel}" for rel in sorted(changes)]
    if dry_run or not changes:
        return lines
    write_changes(slime_dir, changes)
    if commit and _git_work_tree(slime_dir):
        lines += [f"commit {m}" for m in _commit(slime_dir, list(changes))]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slime_dir", type=Path, help="an upstream THUDM/slime checkout (changed in place)")
    parser.add_argument("--dry-run", action="store_true", help="list the changes without making them")
    parser.add_argument("--no-commit", action="store_true", help="write the files but do not commit them")
    parser.add_argument("--pr", choices=("tcod", "adaptive-kl"), default="tcod",
                        help="which pull request: tcod (default) or adaptive-kl (port_adaptive_kl.py)")
    args = parser.parse_args(argv)
    if args.pr == "adaptive-kl":
        from tools.slime_pr import port_adaptive_kl as pr
    else:
        pr = sys.modules[__name__]
    try:
        lines = pr.port(args.slime_dir, dry_run=args.dry_run, commit=not args.no_commit)
    except pr.PortError as err:
        print(f"port.py: refusing: {err}", file=sys.stderr)
        return 2
    if not lines:
        print(f"port.py: {args.slime_dir} already holds this PR; nothing to do")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
