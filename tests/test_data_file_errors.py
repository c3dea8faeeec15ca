"""A prompt file that is not UTF-8, or not JSON lines, is one line naming the flag, the file and the line, before Ray.

Before: a Latin-1 byte gave a 19-line ``UnicodeDecodeError`` naming neither file nor flag.
"""

import json

import pytest

import train
from slime.utils.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_errors")
    model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
    good = root / "good.jsonl"
    good.write_text(json.dumps({"input": "a"}) + "\n")
    return {"root": root, "model": str(model), "good": str(good)}


def refused(files, capsys, *extra) -> str:
    code = train.main(["--hf-checkpoint", files["model"], "--num-rollout", "1", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_file_that_is_not_utf8_is_named_with_its_flag_and_line(files, capsys, dry_run):
    import ray

    latin1 = files["root"] / "latin1.jsonl"
    latin1.write_bytes(b'{"input": "a"}\n{"input": "caf\xe9"}\n')
    line = refused(files, capsys, "--prompt-data", str(latin1), *(["--dry-run"] if dry_run else []))
    assert line == (f"train.py: error: --prompt-data: {latin1}:2: not UTF-8 text (byte 0xe9 at column 15); write the "
                    "file as UTF-8 JSON lines")
    assert not ray.is_initialized()


def test_an_eval_file_is_named_by_its_flag_and_set(files, capsys):
    utf16 = files["root"] / "utf16.jsonl"
    utf16.write_bytes('{"input": "a"}\n'.encode("utf-16"))
    line = refused(files, capsys, "--prompt-data", files["good"], "--eval-prompt-data", "heldout", str(utf16),
                   "--eval-interval", "1", "--dry-run")
    assert line.startswith(f"train.py: error: --eval-prompt-data heldout: {utf16}:1: not UTF-8 text"), line


@pytest.mark.parametrize("text,message", [
    ('[\n  {"input": "a"}\n]\n', ":1: not valid JSON (Expecting value): the file looks like one JSON document, not "
                                 "JSON lines (one object per line)"),
    ('[{"input": "a"}, {"input": "b"}]\n', ":1: each row must be a JSON object (JSON lines: one object per line), "
                                           "got a JSON list"),
])
def test_a_json_document_instead_of_json_lines_says_so(files, capsys, text, message):
    doc = files["root"] / "doc.jsonl"
    doc.write_text(text)
    assert refused(files, capsys, "--prompt-data", str(doc), "--dry-run") == f"train.py: error: --prompt-data: {doc}{message}"


def test_a_utf8_file_with_a_byte_order_mark_is_read(files, capsys):
    bom = files["root"] / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"input": "a"}).encode() + b"\n")
    assert train.main(["--hf-checkpoint", files["model"], "--num-rollout", "1", "--prompt-data", str(bom),
                       "--allow-no-reward", "--dry-run"]) == 0
