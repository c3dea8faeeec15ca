"""Pages that speak of the same thing say the same: script defaults as the scripts set them, and one answer to
"how do I make the demo quicker" (the demo page's FAQ once said to shorten SFT; the quick start, measured,
says a shorter SFT is not a quicker look)."""

import os
import re
import statistics
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK_START = (ROOT / "docs/en/get_started/quick_start.md").read_text()
DEMO = (ROOT / "docs/en/demo.md").read_text()


def _default(script: str, variable: str) -> str:
    text = (ROOT / script).read_text()
    return re.search(rf'{variable}="?\$\{{{variable}:-(\w+)\}}', text).group(1)


def test_the_quick_start_states_each_scripts_tcod_mode_default_as_the_script_sets_it():
    runtime = _default("scripts/run-qwen3-8B-tcod-runtime.sh", "TCOD_MODE")
    pr = _default("examples/multi_turn_tcod/run-qwen3-8B-tcod.sh", "TCOD_MODE")
    text = " ".join(QUICK_START.split())
    assert f"`TCOD_MODE` (`f2b` or `b2f`, default `{runtime}`)" in text  # the runtime script's variables
    assert (f"That script's `TCOD_MODE` defaults to `{pr}` (this runtime's script, below, defaults to "
            f"`{runtime}`)") in text


def test_no_page_offers_a_shorter_sft_as_a_quicker_look():
    assert "A shorter SFT is not a quicker look" in QUICK_START
    faq = " ".join(DEMO.split("## FAQ", 1)[1].split())
    assert "A shorter SFT is not a quicker look" in faq
    assert not re.search(r"shorten SFT|TEACHER_STEPS`, `STUDENT_STEPS`, `STEPS`", faq)


# ---------------------------------------------------------------- plain sentences (issue 59)
# README.md and the quick start are what a visitor reads first: plain sentences, median under 20 words, none over
# 40. A sentence ends at . ! or ? before a space, and at the end of a paragraph, a list item, a heading or a table
# row; fenced code is not prose; a link counts as its text; every other whitespace-separated token is a word.
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
FIRST_READ = ("README.md", "docs/en/get_started/quick_start.md")


def prose_sentences(markdown: str) -> list[str]:
    blocks, current, fenced = [], [], False

    def close():
        if current:
            blocks.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        if FENCE.match(line):
            close()
            fenced = not fenced
            continue
        text = line.strip()
        if fenced:
            continue
        if not text or text.startswith(("#", "|")) or re.match(r"([-*+]|\d+\.)\s", text):
            close()
            if text.startswith(("#", "|")):
                blocks.append(text)
                continue
        if text:
            current.append(text)
    close()
    sentences = []
    for block in blocks:
        sentences += [s for s in re.split(r"(?<=[.!?])\s+", LINK.sub(r"\1", block)) if s.strip()]
    return sentences


def _words(sentence: str) -> int:
    return len(sentence.split())


def test_the_sentence_measure_sees_what_a_reader_sees():
    long = " ".join(["word"] * 41) + "."
    page = (f"# A title\n\nShort one. Another [linked text](https://example.com/a/very/long/url) here.\n\n"
            f"```bash\n{long}\n```\n\n- an item\n  goes on.\n- {long}\n")
    sentences = prose_sentences(page)
    assert sentences == ["# A title", "Short one.", "Another linked text here.", "- an item goes on.", f"- {long}"]
    assert max(map(_words, sentences)) == 42


@pytest.mark.parametrize("page", FIRST_READ)
def test_the_first_pages_read_in_plain_sentences(page):
    sentences = prose_sentences((ROOT / page).read_text())
    lengths = sorted(map(_words, sentences))
    too_long = [s for s in sentences if _words(s) > 40]
    assert not too_long, f"{page}: {len(too_long)} sentence(s) over 40 words, the first: {too_long[0]!r}"
    assert statistics.median(lengths) < 20, f"{page}: median sentence of {statistics.median(lengths)} words"


@pytest.mark.parametrize("page", FIRST_READ)
def test_terms_are_defined_where_first_used_and_this_machine_is_the_readers(page):
    text = " ".join((ROOT / page).read_text().split())
    definitions = {"OPD": "on-policy distillation (OPD)", "F2B": "F2B (front to back)", "B2F": "B2F (back to front)"}
    for term, definition in definitions.items():
        first = re.search(rf"\b{term}\b", text)
        assert first, f"{page}: {term} is not used"
        at = text.lower().find(definition.lower())
        assert 0 <= at <= first.start() <= at + len(definition), f"{page}: {term} is used before {definition!r}"
    first_tcod = re.search(r"\bTCOD\b", text).start()
    assert re.match(r"TCOD (\(\[)?Temporal Curriculum|TCOD is a temporal curriculum", text[first_tcod:]), \
        f"{page}: TCOD is used before it is defined: {text[first_tcod:first_tcod + 80]!r}"
    assert "this machine" not in text.lower(), f"{page}: 'this machine' (whose? the authors' or the reader's)"


def test_the_readmes_first_screen_says_what_this_is_and_how_to_run_it():
    lines = (ROOT / "README.md").read_text().splitlines()
    screen = "\n".join(lines[:45])
    # The two pull requests and the two tools, each linked to its page.
    items = re.findall(r"^- \*\*(.*?)\*\*(.*\n(?:  .*\n)*)", screen + "\n", re.M)
    for label, page in (("TCOD ([Temporal Curriculum", "examples/multi_turn_tcod/README.md"),
                        ("An adaptive KL controller", "docs/en/advanced/adaptive-kl-controller.md"),
                        ("A runtime that stands in for slime on a CPU", "docs/en/demo.md"),
                        ("A harness that runs slime's own `train.py` on a CPU", "tools/slime_pr/README_train_cpu.md")):
        item = [(bold, rest) for bold, rest in items if bold.startswith(label)]
        assert item and f"]({page})" in item[0][1], f"README's first screen: {label!r} linked to {page}"
        assert item[0][0].endswith("a pull request.") == ("KL" in label or "TCOD" in label), item[0][0]
        assert (ROOT / page).is_file()
    # TCOD with slime on GPUs: port the PR, then the example's launch script, in that order.
    port, launch = screen.find("tools/slime_pr/port.py /path/to/slime"), \
        screen.find("cd /path/to/slime && bash examples/multi_turn_tcod/run-qwen3-8B-tcod.sh")
    assert 0 <= port < launch, "README's first screen: the port and launch commands"
    # The two set-up commands, exactly these two.
    makes = [line.split("#")[0].strip() for line in lines if line.startswith("make ")]
    assert makes == ["make demo", "make test"], makes
    assert all(f"make {m}" in screen for m in ("demo", "test"))


def test_readme_links_each_measured_figure_to_the_page_that_owns_it():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Measured results", 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(items) >= 4 and all("](" in line for line in items[:-1]), items
    # No measured percentage or timing outside that section's links: figures live on their pages.
    assert not re.search(r"\d+(\.\d+)?\s?%|\d+ (s|min|minutes)\b", readme), "README states a measured figure"


# ---------------------------------------------------------------- the demo's output and the refusals, as documented


def test_the_demo_page_shows_the_table_the_report_prints():
    from scripts.tcod_report import GAP_NOTE, markdown_table

    header = markdown_table({}).splitlines()[0]
    assert header.count("|") == 10 and "gap closed" in header and "eval success: teacher" in header
    assert f"\n{header}\n" in DEMO and f"\n{GAP_NOTE}\n" in DEMO
    quick = " ".join(QUICK_START.split())
    assert "The table gives each method's share of the teacher-student gap" in quick
    assert "The table gives each method's share of the teacher-student gap" in (ROOT / "README.md").read_text()


def test_every_flag_the_runtime_refuses_is_listed_in_failure_behaviour():
    from argparse import Namespace

    from slime.arguments.unsupported_flags import ABSENT, refused_flags

    page = " ".join((ROOT / "docs/en/failure-behaviour.md").read_text().split())
    everything = Namespace(partial_rollout=True, colocate=True, balance_data=True, recompute_granularity="selective",
                           pipeline_model_parallel_size=2, context_parallel_size=2, expert_model_parallel_size=2,
                           expert_tensor_parallel_size=2, num_experts=8, optimizer="sgd", lr_decay_style="cosine")
    refused = [item.split(" (")[0].split(" ")[0] for item in refused_flags(everything)]
    assert len(refused) == 11, refused
    listed = page.split("flags that this parser parses only to refuse them:", 1)[1].split(";", 1)[0]
    assert all(f"`{flag}" in listed for flag in refused), (refused, listed)
    assert f"`--num-epoch`, `--offload` and {len(ABSENT) - 2} more" in page
    assert "drop --partial-rollout" in page and "--kl-ctrl adaptive needs --kl-coef > 0 (got 0) and" in page


def test_help_and_docs_say_partial_rollout_is_refused_before_ray():
    from slime.utils.arguments import get_parser

    (action,) = [a for a in get_parser()._actions if "--partial-rollout" in a.option_strings]
    assert "refused here before Ray" in action.help


def test_the_gpu_script_and_its_docs_name_the_same_refusal_and_log(tmp_path):
    script = (ROOT / "scripts/run-qwen3-8B-tcod-runtime.sh").read_text()
    quick = " ".join(QUICK_START.split())
    assert 'TEACHER_LOG="${SAVE%/}.teacher.log"' in script and "The teacher server's log is `SAVE.teacher.log`" in quick
    assert "Without them it stops at once, in one line that names `DRY_RUN`." in quick
    # The line failure-behaviour.md quotes is the one the script prints on a machine without a GPU.
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "REHEARSAL", "NUM_GPUS")}
    out = subprocess.run(["bash", "scripts/run-qwen3-8B-tcod-runtime.sh"], cwd=ROOT, capture_output=True, text=True,
                         env={**env, "PATH": f"{tmp_path}{os.pathsep}{env['PATH']}"}, timeout=60)
    (line,) = out.stderr.splitlines()
    assert out.returncode == 2 and "DRY_RUN=1" in line, line
    assert f"\n{line}\n" in (ROOT / "docs/en/failure-behaviour.md").read_text()
