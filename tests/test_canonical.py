from config.canonical import canonical_json, nul_paths


def test_it_writes_one_text_per_value_whatever_the_key_order():
    assert canonical_json({"b": 1, "a": [2, "ü"]}) == canonical_json({"a": [2, "ü"], "b": 1}) == '{"a":[2,"ü"],"b":1}'


def test_it_finds_nul_characters_in_strings_and_keys():
    assert nul_paths({"a": "x\x00", "b": [1, "\x00"], "ok": "fine"}, "input") == ["input.a", "input.b.1"]
    assert nul_paths({"k\x00": 1}) == ["k\x00"]
    assert nul_paths({"clean": ["a", {"b": 1.5}]}) == []
