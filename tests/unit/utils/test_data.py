"""Prompt data: JSONL / Parquet reading, slices, file/line errors, prompt building, Dataset order."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from slime.utils.data import Dataset, build_samples, load_prompt_rows, load_tokenizer, parse_data_path
from slime.utils.types import Sample

ROWS = [
    {"input": f"what is {i}+{i}?", "label": str(2 * i), "metadata": {"rm_type": "math", "level": i}}
    for i in range(5)
]


def write_jsonl(path, rows, blank_lines=False):
    lines = [json.dumps(r) for r in rows]
    if blank_lines:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def jsonl(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", ROWS)


@pytest.fixture
def parquet(tmp_path):
    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


def test_parse_data_path():
    assert parse_data_path("a/b.jsonl") == ("a/b.jsonl", slice(None))
    assert parse_data_path("a/b.jsonl@[2:5]") == ("a/b.jsonl", slice(2, 5))
    assert parse_data_path("b.parquet@[:-1]") == ("b.parquet", slice(None, -1))
    assert parse_data_path("b.parquet@[3:]") == ("b.parquet", slice(3, None))


def test_jsonl_and_parquet_give_identical_rows_and_samples(jsonl, parquet):
    assert load_prompt_rows(str(jsonl)) == load_prompt_rows(str(parquet)) == ROWS
    kw = dict(input_key="input", label_key="label", metadata_key="metadata")
    a = build_samples(load_prompt_rows(str(jsonl)), **kw)
    b = build_samples(load_prompt_rows(str(parquet)), **kw)
    assert [s.to_dict() for s in a] == [s.to_dict() for s in b]
    assert a[3].prompt == "what is 3+3?" and a[3].label == "6" and a[3].metadata["level"] == 3


@pytest.mark.parametrize("spec,expect", [("[1:3]", [1, 2]), ("[:2]", [0, 1]), ("[-2:]", [3, 4]), ("[:]", [0, 1, 2, 3, 4])])
def test_slices_follow_python_semantics(jsonl, parquet, spec, expect):
    for path in (jsonl, parquet):
        rows = load_prompt_rows(f"{path}@{spec}")
        assert [r["metadata"]["level"] for r in rows] == expect


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", ROWS[:2], blank_lines=True)
    path.write_text(path.read_text() + '{"input": "broken\n')  # physical line 4
    with pytest.raises(ValueError, match=rf"{path}:4: malformed JSON"):
        load_prompt_rows(str(path))


def test_missing_input_key_names_key_file_and_line(tmp_path):
    rows = [ROWS[0], {"question": "no input here"}]
    path = write_jsonl(tmp_path / "keys.jsonl", rows, blank_lines=True)  # row 2 is on line 3
    with pytest.raises(KeyError, match=rf"{path}:3: row has no --input-key 'input'"):
        load_prompt_rows(str(path), input_key="input")
    # a slice that leaves the bad row out loads fine
    assert load_prompt_rows(f"{path}@[:1]", input_key="input") == [ROWS[0]]
    ppath = tmp_path / "keys.parquet"
    pq.write_table(pa.Table.from_pylist([{"input": "a"}, {"input": None, "q": "b"}]), ppath)
    with pytest.raises(KeyError, match=rf"{ppath} row 1: row has no --input-key 'prompt'"):
        load_prompt_rows(str(ppath), input_key="prompt")
    with pytest.raises(KeyError, match=rf"{ppath} row 2: row has no --input-key 'input' \(missing or null"):
        load_prompt_rows(str(ppath), input_key="input")


def test_unsupported_or_missing_file(tmp_path):
    with pytest.raises(ValueError, match="--prompt-data .*unsupported file type '.csv'"):
        load_prompt_rows(str(tmp_path / "x.csv"))
    with pytest.raises(FileNotFoundError, match="--prompt-data file .*missing.jsonl"):
        load_prompt_rows(str(tmp_path / "missing.jsonl"))


def test_build_samples_defaults_without_template():
    rows = [{"input": [{"role": "user", "content": "hi"}]}, {"input": "plain", "metadata": None}]
    samples = build_samples(rows, input_key="input")
    assert samples[0].prompt == [{"role": "user", "content": "hi"}] and samples[0].label is None
    assert samples[1].prompt == "plain" and samples[1].metadata == {}
    with pytest.raises(KeyError, match="data.jsonl row 1: no --input-key 'question'"):
        build_samples(rows, input_key="question", source="data.jsonl")


def test_chat_template_string_and_messages(tiny_moe_hf):
    tok = load_tokenizer(str(tiny_moe_hf))
    assert load_tokenizer(str(tiny_moe_hf)) is tok  # cached
    rows = [{"input": "hi"}, {"input": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}]
    samples = build_samples(rows, tokenizer=tok, input_key="input", apply_chat_template=True)
    expected = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert samples[0].prompt == expected and "hi" in expected and expected != "hi"
    assert samples[1].prompt.startswith(
        tok.apply_chat_template(rows[1]["input"][:1], tokenize=False, add_generation_prompt=False)
    )


def test_tools_and_template_kwargs_reach_the_template(tiny_moe_hf):
    tok = AutoTokenizer.from_pretrained(str(tiny_moe_hf))
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if tools %}[tools:{% for t in tools %}{{ t['name'] }}{% endfor %}]{% endif %}"
        "{% if shout %}!{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    rows = [{"input": "q", "tools": json.dumps([{"name": "calc"}])}, {"input": "r"}]
    samples = build_samples(
        rows, tokenizer=tok, input_key="input", tool_key="tools", apply_chat_template=True,
        apply_chat_template_kwargs='{"shout": true}',
    )
    assert [s.prompt for s in samples] == ["<user>q[tools:calc]!<assistant>", "<user>r!<assistant>"]
    assert samples[0].apply_chat_template_kwargs == {"shout": True}


def test_long_prompts_dropped_with_logged_count(tiny_moe_hf, caplog):
    tok = load_tokenizer(str(tiny_moe_hf))
    rows = [{"input": "short"}, {"input": "long " * 50}, {"input": "tiny"}]
    limit = len(tok("short", add_special_tokens=False)["input_ids"])
    with caplog.at_level(logging.INFO, logger="slime.utils.data"):
        samples = build_samples(rows, tokenizer=tok, input_key="input", max_prompt_len=limit, source="f.jsonl")
    assert [s.prompt for s in samples] == ["short", "tiny"]
    assert "dropped 1 of 3 prompts" in caplog.text and "f.jsonl" in caplog.text
    with pytest.raises(ValueError, match="--rollout-max-prompt-len need a tokenizer"):
        build_samples(rows, input_key="input", max_prompt_len=4)


def test_dataset_shuffle_depends_only_on_seed_plus_epoch():
    ds = Dataset([Sample(index=i) for i in range(20)])
    assert [ds[i].index for i in range(20)] == list(range(20))
    ds.shuffle(epoch=1, seed=42)
    first = [ds[i].index for i in range(20)]
    ds.shuffle(epoch=2, seed=42)
    assert [ds[i].index for i in range(20)] != first
    ds.shuffle(epoch=0, seed=43)  # same seed + epoch as (1, 42)
    assert [ds[i].index for i in range(20)] == first
    assert sorted(first) == list(range(20)) and len(ds) == 20
