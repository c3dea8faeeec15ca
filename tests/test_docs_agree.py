"""Pages that speak of the same thing say the same: script defaults as the scripts set them, and one answer to
"how do I make the demo quicker" (the demo page's FAQ once said to shorten SFT; the quick start, measured,
says a shorter SFT is not a quicker look)."""

import re
from pathlib import Path

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
    assert (f"That script's `TCOD_MODE` defaults to `{pr}` (this runtime's script above defaults to "
            f"`{runtime}`)") in text


def test_no_page_offers_a_shorter_sft_as_a_quicker_look():
    assert "A shorter SFT is not a quicker look" in QUICK_START
    faq = " ".join(DEMO.split("## FAQ", 1)[1].split())
    assert "A shorter SFT is not a quicker look" in faq
    assert not re.search(r"shorten SFT|TEACHER_STEPS`, `STUDENT_STEPS`, `STEPS`", faq)
