"""Plugin-facing helpers at slime's module paths: data.read_file, base_types.call_rollout_fn."""

import inspect
import json

import pytest

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn
from slime.utils.data import read_file
from slime.utils.types import Sample


def test_read_file_is_a_generator_with_slices(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(json.dumps({"i": i}) for i in range(5)) + "\n\n{bad json\n")
    assert inspect.isgenerator(read_file(str(path)))
    assert [r["i"] for r in read_file(str(path))] == [0, 1, 2, 3, 4]
    assert [r["i"] for r in read_file(f"{path}@[1:3]")] == [1, 2]
    assert [r["i"] for r in read_file(f"{path}@[-2:]")] == [3, 4]
    assert [r["i"] for r in read_file(f"{path}@[:1]")] == [0]
    with pytest.raises(FileNotFoundError):
        list(read_file(str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError):
        list(read_file(str(tmp_path / "x.csv")))


def test_call_rollout_fn_wraps_without_checking():
    def fn(args, rollout_id, data_source, evaluation=False):
        return {"evaluation": evaluation, "rollout_id": rollout_id}

    out = call_rollout_fn(fn, "args", 3, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput) and out.data == {"evaluation": True, "rollout_id": 3}
    train = call_rollout_fn(fn, "args", 4, data_source=None, evaluation=False)
    assert isinstance(train, RolloutFnTrainOutput) and train.samples["rollout_id"] == 4
    ready = RolloutFnTrainOutput(samples=[[Sample()]])
    assert call_rollout_fn(lambda **kw: ready, evaluation=False) is ready
    with pytest.raises(TypeError):
        call_rollout_fn(fn, "args", 1, None)  # evaluation is keyword-only and required


def test_get_source_and_filter_long_prompt():
    from slime.utils.data import filter_long_prompt, get_source

    tagged = Sample(metadata={"source_name": "gsm8k"})
    assert get_source(tagged) == "gsm8k" and get_source(Sample()) == "unknown"
    tagged.source = "aime"
    assert get_source(tagged) == "aime"

    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

    samples = [Sample(prompt="a b c"), Sample(prompt="a")]
    assert [s.prompt for s in filter_long_prompt(samples, Tok(), None, 2)] == ["a"]
    assert len(filter_long_prompt(samples, Tok(), None, None)) == 2
