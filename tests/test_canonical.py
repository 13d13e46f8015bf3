from config.base.canonical import canonical_json, canonical_sha256, nul_paths
from tasks_app.events import event_hash, event_hash_of_canonical
from tasks_app.models import TaskStatus


def test_it_writes_one_text_per_value_whatever_the_key_order():
    assert canonical_json({"b": 1, "a": [2, "ü"]}) == canonical_json({"a": [2, "ü"], "b": 1}) == '{"a":[2,"ü"],"b":1}'


def test_it_finds_nul_characters_in_strings_and_keys():
    assert nul_paths({"a": "x\x00", "b": [1, "\x00"], "ok": "fine"}, "input") == ["input.a", "input.b.1"]
    assert nul_paths({"k\x00": 1}) == ["k\x00"]
    assert nul_paths({"clean": ["a", {"b": 1.5}]}) == []


def test_it_hashes_an_event_as_the_canonical_json_of_its_link():
    data = {"z": 1, "message": 'quote " backslash \\ tab \t ü 😀', "nested": {"b": [1.5, None, True], "a": "x"}}
    for prev, seq, type_ in [("", 1, "status"), ("ab" * 32, 12345, "plan.adjusted"), ("p", 2, TaskStatus.QUEUED),
                             ("p", 3, 'ty"pé')]:
        link = {"prev": prev, "seq": seq, "type": type_, "data": data}
        assert event_hash(prev_hash=prev, seq=seq, type=type_, data=data) == canonical_sha256(link)
        assert event_hash_of_canonical(prev_hash=prev, seq=seq, type=type_,
                                       data_json=canonical_json(data)) == canonical_sha256(link)
