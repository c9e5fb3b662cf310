"""Which ground truths a table's score function has nothing to compare with (refused at load)."""

import pytest

from posttrain.rewards.registry import lacks_ground_truth


@pytest.mark.parametrize("value, lacks", [
    (None, True), ("", True), ("  \n", True), ([], True), ({}, True),
    ("0", False), (0, False), (0.0, False), ("42", False), (["a"], False), ({"target": ["Paris"]}, False),
])
def test_lacks_ground_truth_by_hand(value, lacks):
    assert lacks_ground_truth(value) is lacks
