"""The docs a user reads point at files that exist and name flags that exist.

* Every relative Markdown link (and image) in README.md, docs/**/*.md and examples/**/README.md
  resolves to a file of this repository; a ``#anchor`` into a Markdown file must name one of its
  headings (GitHub's slugs). The one exception is the pull requests' pages (tools/slime_pr/manifest*.py),
  which link upstream slime's pages relatively, as they will sit in its tree (the harness,
  tools/slime_pr/verify_pr.py, checks those links in the ported tree); this repository's own pages link
  upstream's files as https://github.com/THUDM/slime/blob/main/PATH. A repository path they name in backticks (``slime/rollout/tcod.py``)
  exists, unless it is one of upstream slime's files.
* Every ``--flag`` named in those docs and in scripts/*.sh and examples/multi_turn_tcod/*.sh is known
  to the command it belongs to: train.py's parser (``slime.utils.arguments.get_parser``), the parser
  of this repository's other command-line tools (read from their source or their ``--help``), or a
  small explicit list per outside program (SGLang, Ray, Megatron-LM, upstream slime's train.py).
  In a shell command (a script, or a fenced ``bash`` block) a flag belongs to the nearest command
  before it on that logical line, and a bash array's flags to the command that expands the array.
  In prose, where no command is written, the flag must be known to one of these commands.

No model, no subprocess: a few hundred milliseconds.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from functools import lru_cache
from pathlib import Path

import pytest

from slime.utils.arguments import get_parser
from tools.slime_pr import manifest, manifest_adaptive_kl

ROOT = Path(__file__).resolve().parents[1]

DOCS = sorted(
    {ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("README.md")}
)
# examples/multi_turn_tcod/run-qwen3-8B-tcod.sh is upstream slime's launch script (the PR's): its flags
# are upstream's, Megatron-LM's and SGLang's, checked against those parsers by
# tools/slime_pr/check_launch_flags.py (tests/test_slime_pr_launch_flags.py), not against this runtime.
UPSTREAM_LAUNCH_SCRIPT = ROOT / "examples/multi_turn_tcod/run-qwen3-8B-tcod.sh"
SCRIPTS = sorted(
    p for p in [*(ROOT / "scripts").glob("*.sh"), *(ROOT / "examples/multi_turn_tcod").glob("*.sh")]
    if p != UPSTREAM_LAUNCH_SCRIPT
)

# The PR's Markdown files link to pages of upstream slime's tree, which exist there and not here
# (tools/slime_pr/verify_pr.py checks them in the ported tree). Repository-relative paths.
UPSTREAM_ONLY_TARGETS = {
    "docs/en/advanced/on-policy-distillation.md",
    "docs/en/get_started/customization.md",
    "examples/on_policy_distillation/README.md",
    "examples/geo3k_vlm_multi_turn/README.md",
}
PR_MARKDOWN = {p for p in (*manifest.COPIED_FILES, *manifest_adaptive_kl.COPIED_FILES) if p.endswith(".md")}
UPSTREAM_URL = "https://github.com/THUDM/slime/blob/main/"
# Files of upstream slime's tree that the docs name in backticks as upstream's: they exist there, not here.
UPSTREAM_PATHS = {
    "examples/geo3k_vlm_multi_turn", "examples/README.md", "examples/on_policy_distillation/run-qwen3-8B-opd.sh",
    "scripts/models/qwen3-8B.sh", "scripts/models/qwen3-1.7B.sh", "tests/test_sample.py", "tests/test_rollout_metrics.py",
}
REPO_PATH = re.compile(r"`((?:docs|examples|scripts|slime|tools|benchmarks|tests)/[\w./-]*)`")

# Flags of programs that are not part of this repository, each list only what the docs name.
OUTSIDE = {
    # python -m sglang.launch_server (SGLang 0.5.23), as the GPU scripts and docs/en/engines.md start it.
    "sglang": {
        "--model-path", "--host", "--port", "--tp-size", "--tensor-parallel-size", "--tp",
        "--mem-fraction-static", "--context-length", "--random-seed", "--enable-deterministic-inference",
        "--disable-radix-cache", "--base-gpu-id",
        # its CPU settings, which the launcher adds where there is no CUDA device (docs/en/engines.md)
        "--device", "--attention-backend", "--sampling-backend", "--disable-cuda-graph", "--disable-overlap-schedule",
        "--skip-server-warmup", "--max-total-tokens", "--dtype",
        # the harness adds it too: an idle scheduler otherwise polls (tools/slime_pr/train_cpu_engines.py)
        "--sleep-on-idle",
    },
    # python -m sglang_router.launch_router (sglang-router 0.3.2), which the runtime starts in front of engines.
    "sglang-router": {"--worker-urls", "--policy", "--host", "--port"},
    # ray start / ray job submit.
    "ray": {"--head", "--num-gpus", "--disable-usage-stats", "--address", "--runtime-env-json"},
    # Megatron-LM's own flags that docs/en/megatron_backend.md names but this runtime does not take.
    "megatron": {"--ckpt-step", "--finetune"},
    # Upstream slime's train.py flags that the PR's docs name and this runtime does not have.
    "upstream slime": {"--ci-test", "--partial-rollout", "--router-policy", "--use-rollout-routing-replay",
                       "--custom-advantage-function-path", "--disable-compute-advantages-and-returns",
                       "--ref-update-interval", "--rollout-sample-hook-path", "--disable-rewards-normalization",
                       # failure-behaviour.md's examples of slime flags refused with what to use instead
                       "--num-epoch", "--offload"},
    # hf download (huggingface_hub), in the example README's download step.
    "hf": {"--local-dir"},
}

FLAG = re.compile(r"(?<![\w$-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?:-\*)?")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _ast_flags(rel: str) -> set[str]:
    """The option strings of every ``add_argument`` call in a source file (or package)."""
    path = ROOT / rel
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    flags = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            name = getattr(node.func, "attr", getattr(node.func, "id", "")) if isinstance(node, ast.Call) else ""
            if name == "add_argument":
                flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


def _help_flags(main) -> set[str]:
    """The flags a ``main(argv)`` prints with ``--help`` (for parsers built from data)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return set(re.findall(r"--[a-z][a-z0-9-]*", out.getvalue()))


@lru_cache(maxsize=None)
def commands() -> dict[str, set[str]]:
    """Command name -> the flags it accepts."""
    from examples.agent_envs import make_data as agent_make_data
    from examples.multi_turn_tcod.envs import make_data as pr_make_data

    known = {
        "train.py": set(get_parser()._option_string_actions),
        "hf_engine": _ast_flags("slime/backends/hf_engine/__main__.py"),
        "wait_healthy": _ast_flags("slime/backends/sglang_utils/wait_healthy.py"),
        "sglang_env": _ast_flags("slime/backends/sglang_utils/sglang_env.py"),
        "tiny_models": _ast_flags("slime/utils/tiny_models.py"),
        "expert_sft": _ast_flags("slime/rollout/expert_sft.py"),
        "agent_envs.make_data": _help_flags(agent_make_data.main),
        "envs.make_data": _help_flags(pr_make_data.main),
        "tcod_report": _ast_flags("scripts/tcod_report.py"),
        "sft_eval": _ast_flags("scripts/sft_eval.py"),
        "port.py": _ast_flags("tools/slime_pr/port.py"),
        "train_cpu": _ast_flags("tools/slime_pr/train_cpu.py"),
        "check_launch_flags": _ast_flags("tools/slime_pr/check_launch_flags.py"),
        "rehearsal": _ast_flags("scripts/rehearsal.py"),
        "rehearse_launch": _ast_flags("tools/slime_pr/rehearse_launch.py"),
        **{f"benchmarks/{p.name}": _ast_flags(f"benchmarks/{p.name}") for p in (ROOT / "benchmarks").glob("*.py")},
        **OUTSIDE,
    }
    # upstream's tools/convert_hf_to_torch_dist.py takes Megatron's model flags and slime's checkpoint ones.
    known["convert_hf_to_torch_dist"] = known["train.py"] | known["megatron"]
    # serve.py: train.py's parser plus the port it serves on.
    known["serve"] = known["train.py"] | _ast_flags("slime/backends/sglang_utils/serve.py")
    return known


# How a shell command names its program; the nearest match before a flag owns it.
MARKERS = [
    (re.compile(r"sglang\.launch_server"), "sglang"),
    (re.compile(r"slime\.backends\.hf_engine(?![.\w])"), "hf_engine"),
    (re.compile(r"wait_healthy"), "wait_healthy"),
    (re.compile(r"sglang_utils\.serve\b"), "serve"),
    (re.compile(r"sglang_utils\.sglang_env\b"), "sglang_env"),
    (re.compile(r"sglang_router\.launch_router"), "sglang-router"),
    (re.compile(r"tiny_models"), "tiny_models"),
    (re.compile(r"slime\.rollout\.expert_sft"), "expert_sft"),
    (re.compile(r"examples\.agent_envs\.make_data"), "agent_envs.make_data"),
    (re.compile(r"examples\.multi_turn_tcod\.envs\.make_data"), "envs.make_data"),
    (re.compile(r"tcod_report"), "tcod_report"),
    (re.compile(r"scripts\.sft_eval"), "sft_eval"),
    (re.compile(r"tools/slime_pr/port\.py"), "port.py"),
    (re.compile(r"\btrain_cpu\.py\b"), "train_cpu"),
    (re.compile(r"check_launch_flags"), "check_launch_flags"),
    (re.compile(r"scripts\.rehearsal\b|scripts/rehearsal\.py"), "rehearsal"),
    (re.compile(r"rehearse_launch"), "rehearse_launch"),
    (re.compile(r"convert_hf_to_torch_dist"), "convert_hf_to_torch_dist"),
    (re.compile(r"\bray (?:start|job submit|stop)\b"), "ray"),
    (re.compile(r"\btrain\.py\b"), "train.py"),
    (re.compile(r"benchmarks/\w+\.py"), None),  # the script's own parser, named by the match
]


def _owners(statement: str) -> list[tuple[int, str]]:
    found = []
    for pattern, name in MARKERS:
        for m in pattern.finditer(statement):
            found.append((m.start(), name or m.group(0)))
    return sorted(found)


def _owner_at(owners, pos: int) -> str | None:
    before = [name for start, name in owners if start < pos]
    return before[-1] if before else None


def _known(flag: str, names) -> bool:
    cmds = commands()
    flags = set().union(*(cmds.get(n, set()) for n in names))
    if flag.endswith("-*"):  # a family, e.g. --tcod-*
        return any(f.startswith(flag[:-1]) for f in flags)
    return flag in flags


def _shell_statements(lines):
    """(first line number, text, array name or None) per logical shell statement, comments apart."""
    out, buf, start, depth, array = [], [], 0, 0, None
    for no, raw in lines:
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            out.append((no, line, "#"))
            continue
        parts = re.split(r"(?:^|\s)#(?:\s|$)", line, maxsplit=1)
        code = parts[0]
        if len(parts) > 1:
            out.append((no, parts[1], "#"))
        if not buf:
            start = no
            m = re.match(r"\s*(?:declare -A\s+)?(\w+)\+?=\(", code)
            array = m.group(1) if m else None
        buf.append(code.rstrip("\\"))
        depth += code.count("(") - code.count(")")
        if code.endswith("\\") or depth > 0:
            continue
        out.append((start, " ".join(buf), array))
        buf, depth, array = [], 0, None
    if buf:
        out.append((start, " ".join(buf), array))
    return out


def _shell_flags(statements, default: set[str]):
    """(line, flag, candidate commands) for every flag of these statements."""
    arrays: dict[str, list[tuple[int, str]]] = {}
    used_by: dict[str, set[str]] = {}
    plain = []
    for no, text, array in statements:
        if array == "#":
            plain.extend((no, f, None) for f in FLAG.findall(text))
            continue
        if array:
            arrays.setdefault(array, []).extend((no, f) for f in FLAG.findall(text.split("(", 1)[1]))
        owners = _owners(text)
        for m in re.finditer(r"\$\{(\w+)\[", text):
            owner = _owner_at(owners, m.start())
            used_by.setdefault(m.group(1), set()).add(owner or (f"array:{array}" if array else ""))
        if not array:
            plain.extend((no, m.group(0), _owner_at(owners, m.start())) for m in FLAG.finditer(text))

    def resolve(name, seen=()):
        owners = set()
        for user in used_by.get(name, set()):
            if user.startswith("array:"):
                parent = user[len("array:"):]
                if parent not in seen:
                    owners |= resolve(parent, (*seen, name))
            elif user:
                owners.add(user)
        return owners

    for no, flag, owner in plain:
        yield no, flag, {owner} if owner else default
    for name, flags in arrays.items():
        owners = resolve(name) or default
        for no, flag in flags:
            yield no, flag, owners


def _markdown_flags(path: Path, default: set[str]):
    lines = path.read_text().splitlines()
    prose, block, in_block, shell = [], [], False, False
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m:
            if in_block:
                if shell:
                    yield from _shell_flags(_shell_statements(block), default)
                else:
                    prose.extend(block)
                block, in_block = [], False
            else:
                lang = line.strip().strip("`~").strip().lower()
                in_block, shell = True, lang in ("", "bash", "sh", "shell", "console")
            continue
        (block if in_block else prose).append((no, line))
    prose.extend(block)
    # Prose (and non-shell blocks) often name several commands' flags on one line: there a flag must
    # be known to one of the commands.
    for no, line in prose:
        for flag in FLAG.findall(line):
            yield no, flag, default


def _unknown_flags(path: Path, root: Path = ROOT) -> list[str]:
    everything = set(commands())
    found = _markdown_flags(path, everything) if path.suffix == ".md" else \
        _shell_flags(_shell_statements(enumerate(path.read_text().splitlines(), 1)), {"train.py"})
    return [f"{path.relative_to(root)}:{no}: {flag} (checked against {', '.join(sorted(owners))})"
            for no, flag, owners in found if not _known(flag, owners)]


def _slug(heading: str) -> str:
    # GitHub's anchors: the heading's text (link targets and backticks dropped), lower case, spaces to
    # hyphens, punctuation other than "-" and "_" removed.
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower()).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_block = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_block = not in_block
        m = None if in_block else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = _slug(m.group(1))
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(path: Path):
    in_block = False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_block = not in_block
            continue
        if in_block:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            yield no, target


def _dead_links(path: Path, root: Path = ROOT) -> list[str]:
    rel = path.relative_to(root).as_posix()
    dead = []
    for no, target in _links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        try:
            dest_rel = dest.relative_to(root.resolve()).as_posix()
        except ValueError:
            dead.append(f"{rel}:{no}: {target} (outside the repository)")
            continue
        if not dest.exists():
            if rel not in PR_MARKDOWN:
                dead.append(f"{rel}:{no}: {target} (no such file here; a file of upstream slime's tree is linked as "
                            f"{UPSTREAM_URL}{dest_rel})")
            elif dest_rel not in UPSTREAM_ONLY_TARGETS:
                dead.append(f"{rel}:{no}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            dead.append(f"{rel}:{no}: {target} (no heading #{anchor} in {dest_rel})")
    return dead


def test_docs_exist():
    assert ROOT / "README.md" in DOCS and ROOT / "docs/en/get_started/quick_start.md" in DOCS
    assert ROOT / "scripts/run-tiny-tcod.sh" in SCRIPTS


def test_every_relative_link_resolves():
    dead = [d for path in DOCS for d in _dead_links(path)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_upstream_only_targets_are_upstreams_and_linked_by_the_pr():
    # The exemption covers only pages this repository lacks and the PR's pages link: a page added here,
    # or one no PR page links any more, must leave the list (else it would hide a dead link).
    here = sorted(t for t in UPSTREAM_ONLY_TARGETS if (ROOT / t).exists())
    assert not here, f"in this repository, so not upstream-only: {here}"
    linked = set()
    for rel in PR_MARKDOWN:
        for _, target in _links(ROOT / rel):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and target.partition("#")[0]:
                dest = ((ROOT / rel).parent / target.partition("#")[0]).resolve()
                with contextlib.suppress(ValueError):
                    linked.add(dest.relative_to(ROOT).as_posix())
    assert UPSTREAM_ONLY_TARGETS <= linked, f"no PR page links {sorted(UPSTREAM_ONLY_TARGETS - linked)}"


def _odd_upstream_urls(path: Path, root: Path = ROOT) -> list[str]:
    """Links into upstream slime's repository that do not name a path on its main branch."""
    odd = []
    for no, target in _links(path):
        m = re.match(r"https?://github\.com/THUDM/slime(/.*)?$", target)
        if m and m.group(1) and not re.match(r"/(blob|tree)/main/[\w./-]+(#[\w-]+)?$", m.group(1)):
            odd.append(f"{path.relative_to(root)}:{no}: {target}")
    return odd


def test_own_pages_link_upstream_files_by_their_blob_url():
    # A link to a file of upstream's repository names its main branch, so it opens from anywhere.
    odd = [o for path in DOCS if path.relative_to(ROOT).as_posix() not in PR_MARKDOWN for o in _odd_upstream_urls(path)]
    assert not odd, f"links into upstream slime not of the form {UPSTREAM_URL}PATH:\n" + "\n".join(odd)


def _missing_paths(path: Path, root: Path = ROOT) -> list[str]:
    """Repository paths named in backticks (`slime/...`, `docs/...`) that do not exist."""
    missing = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        for named in REPO_PATH.findall(line):
            named = named.rstrip("./")
            if re.search(r"(^|/)[A-Z_]{3,}(\.\w+)?$", named):  # a placeholder: benchmarks/results/SETTING.md
                continue
            if not (root / named).exists() and named not in UPSTREAM_PATHS:
                missing.append(f"{path.relative_to(root)}:{no}: {named}")
    return missing


def test_every_repository_path_named_exists():
    missing = [m for path in DOCS for m in _missing_paths(path)]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_named_flag_is_known_to_its_command():
    unknown = [u for path in DOCS + SCRIPTS for u in _unknown_flags(path)]
    assert not unknown, "flags no command knows:\n" + "\n".join(unknown)


def test_the_checks_catch_what_they_should(tmp_path):
    # The scanners themselves: a dead link, a dead anchor, an unknown flag in a code block, in an
    # array a script expands into train.py, and a make_data flag given to train.py, are all found.
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Read me\n")
    doc = tmp_path / "docs" / "probe.md"
    doc.write_text("# Probe\n\n[x](no/such/file.md) [y](../README.md#no-such-heading) [z](#probe)\n"
                   "[w](../README.md#read-me)\n\n"
                   "```bash\npython train.py --no-such-flag 1 --num-rollout 2\n```\n"
                   "Prose `--rollout-batch-size` and `--disks` are known.\n")
    script = tmp_path / "probe.sh"
    script.write_text("ARGS=(--not-a-train-flag --lr 1)\npython3 train.py \"${ARGS[@]}\" --n 3\n"
                      "python -m examples.agent_envs.make_data --env gridnav --n 3 --lr 1\n")
    (tmp_path / "docs" / "paths.md").write_text("`slime/no_such_module.py` and `docs/probe.md`\n")
    # Upstream's pages: linked relatively from one of this repository's pages, the link is dead (with the
    # URL to use instead); from the PR's own page, which will sit in upstream's tree, it is accepted.
    upstream_page = "examples/geo3k_vlm_multi_turn/README.md"
    assert upstream_page in UPSTREAM_ONLY_TARGETS and "examples/multi_turn_tcod/README.md" in PR_MARKDOWN
    (tmp_path / "docs" / "own.md").write_text(f"# Own\n\n[geo3k](../{upstream_page})\n")
    (tmp_path / "examples/multi_turn_tcod").mkdir(parents=True)
    pr_page = tmp_path / "examples/multi_turn_tcod/README.md"
    pr_page.write_text(f"# PR\n\n[geo3k](../../{upstream_page}) [gone](../nowhere.md)\n")
    (own_dead,) = _dead_links(tmp_path / "docs" / "own.md", tmp_path)
    assert own_dead.endswith(f"(no such file here; a file of upstream slime's tree is linked as {UPSTREAM_URL}{upstream_page})")
    assert [d.split(": ")[1].split()[0] for d in _dead_links(pr_page, tmp_path)] == ["../nowhere.md"]
    (tmp_path / "docs" / "urls.md").write_text(
        f"[a]({UPSTREAM_URL}{upstream_page}) [b](https://github.com/THUDM/slime) "
        "[c](https://github.com/THUDM/slime/blob/3f2a1c9/README.md) [d](https://github.com/THUDM/slime/examples)\n")
    assert [o.split(": ")[1] for o in _odd_upstream_urls(tmp_path / "docs" / "urls.md", tmp_path)] == [
        "https://github.com/THUDM/slime/blob/3f2a1c9/README.md", "https://github.com/THUDM/slime/examples"]
    assert [m.split(": ")[1] for m in _missing_paths(tmp_path / "docs" / "paths.md", tmp_path)] == [
        "slime/no_such_module.py"]
    dead = _dead_links(doc, tmp_path)
    assert [d.split(": ")[1].split()[0] for d in dead] == ["no/such/file.md", "../README.md#no-such-heading"], dead
    assert [u.split(": ")[1].split()[0] for u in _unknown_flags(doc, tmp_path)] == ["--no-such-flag"]
    found = [u.split(": ")[1].split()[0] for u in _unknown_flags(script, tmp_path)]
    assert found == ["--n", "--lr", "--not-a-train-flag"], found
