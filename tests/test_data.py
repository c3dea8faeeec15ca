import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slime.utils.data import DataError, Dataset, RolloutDataSource


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows_become_samples(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"input": "abc", "label": "cba", "metadata": {"seed": 1}, "expert_actions": ["up", "left"]},
        {"input": [{"role": "user", "content": "hi"}], "label": "ih"},
    ])
    ds = Dataset(path, input_key="input", label_key="label")
    assert len(ds) == 2
    assert ds.samples[0].prompt == "abc" and ds.samples[0].label == "cba"
    assert ds.samples[0].metadata == {"seed": 1, "expert_actions": ["up", "left"]}
    assert ds.samples[1].metadata == {}


def test_parquet_matches_jsonl(tmp_path):
    rows = [{"input": f"p{i}", "label": str(i)} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    a = Dataset(tmp_path / "d.parquet", label_key="label")
    b = Dataset(_write_jsonl(tmp_path / "d.jsonl", rows), label_key="label")
    assert [s.prompt for s in a.samples] == [s.prompt for s in b.samples]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "x"}', "missing field 'input'"),
    ('{"input": 3}', "field 'input' must be a string"),
    ('{"input": "x", "metadata": 5}', "'metadata' (--metadata-key) must be an object"),
    ('{"input": "x", "expert_actions": "up"}', "'expert_actions' must be a list"),
    ('{"input": "x"', "not valid JSON"),
])
def test_bad_row_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": "fine"}\n' + line + "\n")
    with pytest.raises(DataError) as err:
        Dataset(path)
    assert f"{path}:2" in str(err.value) and message in str(err.value)


def test_missing_label_and_file(tmp_path):
    with pytest.raises(DataError, match="--label-key"):
        Dataset(_write_jsonl(tmp_path / "d.jsonl", [{"input": "x"}]), label_key="label")
    with pytest.raises(DataError, match="does not exist"):
        Dataset(tmp_path / "nope.jsonl")


def test_chat_template_applied(tmp_path):
    from slime.utils.tiny_models import build_tokenizer

    ds = Dataset(_write_jsonl(tmp_path / "d.jsonl", [{"input": "hello"}]), tokenizer=build_tokenizer(),
                 apply_chat_template=True)
    assert ds.samples[0].prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_data_source_groups_epochs_and_resume(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"input": f"p{i}"} for i in range(5)])
    make = lambda: RolloutDataSource(Dataset(path), n_samples_per_prompt=3, shuffle=True, seed=7)  # noqa: E731
    full = make()
    taken = [full.get_samples(2) for _ in range(6)]  # crosses two epoch boundaries
    for groups in taken:
        for group in groups:
            assert len(group) == 3 and len({s.prompt for s in group}) == 1
            assert len({s.group_index for s in group}) == 1
    indices = [s.index for groups in taken for g in groups for s in g]
    assert indices == list(range(36))
    # Every epoch covers every prompt once.
    prompts = [g[0].prompt for groups in taken for g in groups]
    assert sorted(prompts[:5]) == [f"p{i}" for i in range(5)]
    assert sorted(prompts[5:10]) == [f"p{i}" for i in range(5)]

    resumed = make()
    for _ in range(3):
        resumed.get_samples(2)
    state = json.loads(json.dumps(resumed.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    rest = [fresh.get_samples(2) for _ in range(3)]
    assert [[s.prompt for g in gs for s in g] for gs in rest] == \
        [[s.prompt for g in gs for s in g] for gs in taken[3:]]
    assert [s.index for gs in rest for g in gs for s in g] == list(range(18, 36))
