"""A teacher server that reports no vocabulary (real SGLang's /get_model_info) and whose folders are not
readable here: its vocabulary is checked through /generate (token_ids_logprob range, token texts)."""

from __future__ import annotations

import json
import shutil
from argparse import Namespace

import pytest
from aiohttp import web

from _engine_helpers import run, start_hf_engine
from slime.backends.hf_engine import server as hf_server
from slime.backends.teacher_vocab import check_teacher_vocab
from slime.utils import http_utils
from slime.utils.tiny_models import build_tiny_model, build_tokenizer, save_tiny_checkpoint


async def sglang_model_info(request: web.Request) -> web.Response:
    """SGLang 0.5.23's /model_info fields: no vocabulary size, paths on another machine."""
    return web.json_response({"model_path": "/elsewhere/teacher", "served_model_name": "/elsewhere/teacher",
                              "tokenizer_path": "/elsewhere/teacher", "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": "default",
                              "has_image_understanding": False, "has_audio_understanding": False,
                              "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})


def wide(tmp, name, rows=128, seed=1):
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2, seed=seed)
    model.resize_token_embeddings(rows)
    return save_tiny_checkpoint(tmp / name, model=model, tokenizer=tok)


def rotated(tmp, base, name, shift):
    """The same model with a tokenizer whose ordinary tokens are rotated by ``shift`` ids."""
    folder = tmp / name
    shutil.copytree(base, folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    ordinary = sorted((i, t) for t, i in vocab.items() if i >= 3)
    ids = [i for i, _ in ordinary]
    for (_, token), new_id in zip(ordinary, ids[shift:] + ids[:shift]):
        vocab[token] = new_id
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    small = dict(hidden_size=16, num_layers=1, num_heads=2)
    student = save_tiny_checkpoint(tmp / "student", seed=0, **small)
    return {"student": student, "same": save_tiny_checkpoint(tmp / "same", seed=2, **small),
            "wide": wide(tmp, "wide"), "rotated": rotated(tmp, student, "rotated", 7),
            "wide_student": wide(tmp, "wide_student", seed=3)}


@pytest.fixture(scope="module")
def teachers(folders):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_server, "model_info", sglang_model_info)
        servers = {name: start_hf_engine(folders[name])[0] for name in ("same", "wide", "rotated")}
    yield servers
    for server in servers.values():
        server.stop()


def served(url) -> int:
    return run(http_utils.get(f"{url}/get_server_info", max_retries=1))["generate_requests"]


def check(folders, teacher_url, student="student"):
    from transformers import AutoTokenizer

    args = Namespace(rm_url=f"{teacher_url}/generate", hf_checkpoint=str(folders[student]))
    return run(check_teacher_vocab(args, AutoTokenizer.from_pretrained(folders[student])))


def test_a_matching_teacher_passes_the_probe(folders, teachers, caplog):
    url = teachers["same"].url
    before = served(url)
    with caplog.at_level("WARNING", logger="slime.backends.teacher_vocab"):
        info = check(folders, url)
    # Accepted: id V - 1 and the token texts (id V is refused with 400, which the counter does not count).
    assert "vocab_size" not in info and served(url) - before == 2
    assert not [r for r in caplog.records if "could not verify" in r.getMessage()]


def test_a_teacher_with_more_output_rows_is_caught(folders, teachers):
    with pytest.raises(ValueError, match="larger than the student's 100"):
        check(folders, teachers["wide"].url)


def test_a_student_with_more_rows_than_the_teacher_is_caught(folders, teachers):
    with pytest.raises(ValueError, match="model vocabulary .* of 100 but the student .* has 128"):
        check(folders, teachers["same"].url, student="wide_student")


def test_a_teacher_with_another_tokenizer_is_caught(folders, teachers):
    with pytest.raises(ValueError, match="decodes .* probed token ids differently"):
        check(folders, teachers["rotated"].url)
