"""Apply the multi-turn TCOD pull request to an upstream THUDM/slime checkout.

    python tools/slime_pr/port.py SLIME_DIR [--dry-run] [--no-commit]

* copies the PR's files (``manifest.COPIED_FILES``) to the same paths in SLIME_DIR;
* splices ``add_tcod_arguments`` and ``validate_tcod_args`` (from this repository's
  ``slime/utils/tcod_arguments.py``) into upstream's ``slime/utils/arguments.py``: registered right after
  the on-policy-distillation group, validated in ``slime_validate_args`` right after the
  ``--custom-config-path`` YAML is applied;
* adds the docs page to both ``index.rst`` toctrees, the example to ``examples/README.md`` and the GPU
  test to ``.github/workflows/pr-test.yml.j2`` (``pr-test.yml`` re-rendered by upstream's generator).

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
REGISTER_ANCHOR = "        parser = add_on_policy_distillation_arguments(parser)\n"
REGISTER_LINE = "        parser = add_tcod_arguments(parser)\n"
VALIDATE_LINE = "    validate_tcod_args(args)\n"
SPLICED = ("add_tcod_arguments", "TCOD_ROLLOUT_FUNCTION_PATH", "validate_tcod_args")
DOC_ANCHOR = "   advanced/on-policy-distillation.md\n"
DOC_LINE = "   advanced/multi-turn-tcod.md\n"
EXAMPLES_README = "examples/README.md"
EXAMPLES_ANCHOR = "- **[on_policy_distillation](./on_policy_distillation)**"
EXAMPLES_LINE = (
    "- **[multi_turn_tcod](./multi_turn_tcod)**: Multi-turn on-policy distillation of text agents with TCOD's "
    "temporal curriculum (front-to-back or back-to-front trajectory depth).\n"
)

# What the PR relies on in upstream's tree: (file, text that must be there, why).
EXPECTED = (
    (ARGS, "def get_slime_extra_args_provider(", "the argument groups"),
    (ARGS, REGISTER_ANCHOR.strip(), "where the --tcod-* group is registered"),
    (ARGS, "def slime_validate_args(args):", "where the --tcod-* flags are validated"),
    (ARGS, "if args.custom_config_path:", "the YAML that sets max_turns before validation"),
    ("slime/rollout/sglang_rollout.py", "def generate_rollout(", "the rollout function TCOD wraps"),
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
)

# The commit series: (message, paths). Paths not listed under an earlier commit go to the first that
# names their top folder.
COMMITS = (
    (
        "[TCOD] Add --tcod-* arguments and the temporal-curriculum rollout function",
        [ARGS, *manifest.CORE_FILES],
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
def _spliced_source() -> str:
    """The two functions (and their constant) from this repository's tcod_arguments.py, as text."""
    source = (manifest.REPO / manifest.ARGUMENTS_SOURCE).read_text()
    lines = source.splitlines(keepends=True)
    parts = []
    for node in ast.parse(source).body:
        name = getattr(node, "name", None) or (isinstance(node, ast.Assign) and node.targets[0].id)
        if name in SPLICED:
            parts.append("".join(lines[node.lineno - 1 : node.end_lineno]))
    if len(parts) != len(SPLICED):
        raise PortError(f"{manifest.ARGUMENTS_SOURCE} must define {', '.join(SPLICED)}")
    return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)


def _top_level(source: str, name: str):
    for node in ast.parse(source).body:
        if getattr(node, "name", None) == name:
            return node
    return None


def _offset(source: str, line: int) -> int:
    """Index in ``source`` of the start of 1-based line ``line``."""
    return sum(len(x) for x in source.splitlines(keepends=True)[: line - 1])


def _remove_spliced(source: str) -> str:
    """Upstream's arguments.py without a previous splice (so a newer one replaces it)."""
    tree = ast.parse(source)
    nodes = [
        n
        for n in tree.body
        if getattr(n, "name", None) in SPLICED
        or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) in SPLICED)
    ]
    if not nodes:
        return source
    start, end = _offset(source, nodes[0].lineno), _offset(source, nodes[-1].end_lineno + 1)
    return source[:start] + source[end:].lstrip("\n")


def edit_arguments(source: str) -> str:
    source = _remove_spliced(source)
    provider = _top_level(source, "get_slime_extra_args_provider")
    if provider is None:
        raise PortError(f"{ARGS} has no top-level get_slime_extra_args_provider()")
    at = _offset(source, provider.lineno)
    source = source[:at] + _spliced_source() + "\n\n" + source[at:]
    if REGISTER_LINE not in source:
        source = source.replace(REGISTER_ANCHOR, REGISTER_ANCHOR + REGISTER_LINE, 1)
    if VALIDATE_LINE not in source:
        validate = _top_level(source, "slime_validate_args")
        block = next(
            (n for n in validate.body if isinstance(n, ast.If) and "custom_config_path" in ast.unparse(n.test)),
            None,
        )
        if block is None:
            raise PortError(f"{ARGS}: slime_validate_args has no top-level `if args.custom_config_path:` block")
        at = _offset(source, block.end_lineno + 1)
        source = source[:at] + "\n" + VALIDATE_LINE + source[at:]
    ast.parse(source)  # never write a file that does not parse
    return source


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
    for rel in manifest.COPIED_FILES:
        new[rel] = (manifest.REPO / rel).read_bytes()
    new[ARGS] = edit_arguments((slime_dir / ARGS).read_text()).encode()
    for index in ("docs/en/index.rst", "docs/zh/index.rst"):
        new[index] = _insert_after((slime_dir / index).read_text(), DOC_ANCHOR, DOC_LINE).encode()
    examples = (slime_dir / EXAMPLES_README).read_text()
    new[EXAMPLES_README] = _insert_after(examples, EXAMPLES_ANCHOR, EXAMPLES_LINE).encode()
    new[pr_test_entry.TEMPLATE] = pr_test_entry.edit_template((slime_dir / pr_test_entry.TEMPLATE).read_text()).encode()
    return {rel: data for rel, data in new.items() if not (slime_dir / rel).is_file() or (slime_dir / rel).read_bytes() != data}


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
    for rel, data in changes.items():
        (slime_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (slime_dir / rel).write_bytes(data)
    if pr_test_entry.TEMPLATE in changes:
        pr_test_entry.render(slime_dir)
        changes[pr_test_entry.RENDERED] = b""
    if commit and _git_work_tree(slime_dir):
        lines += [f"commit {m}" for m in _commit(slime_dir, list(changes))]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slime_dir", type=Path, help="an upstream THUDM/slime checkout (changed in place)")
    parser.add_argument("--dry-run", action="store_true", help="list the changes without making them")
    parser.add_argument("--no-commit", action="store_true", help="write the files but do not commit them")
    args = parser.parse_args(argv)
    try:
        lines = port(args.slime_dir, dry_run=args.dry_run, commit=not args.no_commit)
    except PortError as err:
        print(f"port.py: refusing: {err}", file=sys.stderr)
        return 2
    if not lines:
        print(f"port.py: {args.slime_dir} already holds this PR; nothing to do")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
