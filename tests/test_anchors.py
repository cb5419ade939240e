from vllm_patch.engine.anchors import find_block, splice


def test_find_block_finds_every_occurrence_including_overlaps():
    lines = ["a", "a", "a", "b", "a", "a"]
    assert find_block(lines, ["a", "a"]) == [0, 1, 4]
    assert find_block(lines, ["a", "b"]) == [2]
    assert find_block(lines, ["c"]) == []
    assert find_block(lines, []) == []
    assert find_block(lines, ["a"] * 7) == []


def test_find_block_is_exact_about_whitespace_and_terminators():
    lines = ["x\n", "y\r\n", "z"]
    assert find_block(lines, ["y\n"]) == []
    assert find_block(lines, ["y\r\n", "z"]) == [1]
    assert find_block(lines, ["y\r\n", "z\n"]) == []


def test_splice():
    assert splice(["a", "b", "c"], 1, 1, ["X", "Y"]) == ["a", "X", "Y", "c"]
