"""One reader for episodes files (posttrain/rewards/episodes_file.py): what `posttrain compare`, the recipes'
tables and the reports of mistakes by kind all read."""

import json

import pytest

from posttrain.errors import InputError
from posttrain.rewards.episodes_file import numbered_rows, source_rows


def test_rows_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n\n  \n" + json.dumps({"a": 2}) + "\n", encoding="utf-8")
    assert list(numbered_rows(path)) == [(1, {"a": 1}), (4, {"a": 2})]


@pytest.mark.parametrize("content, says", [
    (b'{"a": 1}\n{"a": \n', "line 2 is not JSON"),
    (b'{"a": 1}\n[1, 2]\n', "line 2 is not an episode row (a JSON object)"),
    (b'\xff\xfe{"a": 1}\n', "is not UTF-8 text"),
])
def test_a_file_that_is_not_episode_rows_is_refused_naming_where(tmp_path, content, says):
    path = tmp_path / "episodes.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError, match=says.replace("(", r"\(").replace(")", r"\)")):
        list(numbered_rows(path))


def test_source_rows_keep_one_source_and_name_the_line_of_a_row_missing_a_key(tmp_path):
    path = tmp_path / "episodes.jsonl"
    rows = [{"data_source": "x", "extra_info": {"category": "c"}}, {"data_source": "y"}, {"extra_info": {"category": "d"}}]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    assert source_rows(path, "x", ["extra_info.category"], "X") == [rows[0], rows[2]]
    path.write_text(path.read_text() + json.dumps({"data_source": "x", "extra_info": {}}) + "\n")
    with pytest.raises(InputError, match="line 4 is not a X episode row with extra_info.category"):
        source_rows(path, "x", ["extra_info.category"], "X")
