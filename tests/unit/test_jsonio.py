"""The bounded JSON reader (rollout_mock.jsonio, issue 28): every JSON document rollout_mock parses
goes through it, and a hostile one ends in the caller's RolloutMockError naming the file."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_mock.errors import ManifestError, MetricsFormatError
from rollout_mock.jsonio import MAX_DEPTH, loads_bounded, parse_bounded

BOMBS = {
    "deep array": "[" * 5000 + "]" * 5000,
    "deep object": '{"a":' * 3000 + "1" + "}" * 3000,
    "just past the depth": "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "5,000-digit integer": '{"samples": ' + "9" * 5000 + "}",
    "negative 5,000-digit integer": "[-" + "9" * 5000 + "]",
    "1e999": '{"samples": 1e999}',
    "-1e999": "[-1e999]",
    "400-digit float": "[" + "1" * 400 + ".5]",
    "NaN": '{"x": NaN}',
    "Infinity": "[Infinity]",
    "not UTF-8": b'{"a": "\xff"}',
    "truncated": '{"a": [1, 2',
}


@pytest.mark.parametrize("text", BOMBS.values(), ids=BOMBS.keys())
def test_every_bomb_is_our_error_naming_the_file(text: str | bytes) -> None:
    with pytest.raises(ManifestError, match=r"^/d/manifest\.json: unreadable manifest \(") as info:
        loads_bounded(text, where="/d/manifest.json", what="manifest")
    assert info.value.path == "/d/manifest.json" and len(str(info.value)) < 400


def test_the_error_class_and_fix_are_the_callers() -> None:
    with pytest.raises(MetricsFormatError, match="metrics.jsonl: unreadable metrics line .*; fix it"):
        loads_bounded("[" * 200 + "]" * 200, where="metrics.jsonl", error=MetricsFormatError,
                      what="metrics line", fix="fix it")


def test_size_bound() -> None:
    with pytest.raises(ManifestError, match="more than the 100 accepted"):
        loads_bounded(json.dumps(["x" * 200]), where="m.json", max_bytes=100)


def test_depth_counts_structure_not_brackets_in_strings() -> None:
    shallow = {"a": "[[[[{{{{" * 100, "b": ['\\"[', '\\\\', "]]]]"], "c": {"": "\\u005b["}}
    assert loads_bounded(json.dumps(shallow), where="m.json") == shallow
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads_bounded(at_limit, where="m.json") == json.loads(at_limit)
    # brackets in strings cannot hide real depth
    sneaky = '["]",' * 150 + "1" + "]" * 150
    with pytest.raises(ManifestError, match="nested more than"):
        loads_bounded(sneaky, where="m.json")


def test_nan_allowed_on_request() -> None:
    value = loads_bounded('{"loss": NaN, "x": Infinity}', where="metrics.jsonl", allow_nan=True)
    assert value["loss"] != value["loss"] and value["x"] == float("inf")


def test_large_but_legal_numbers_pass() -> None:
    assert loads_bounded('{"a": 1e300, "b": ' + "9" * 100 + ', "c": 1e-999}', where="m") == {
        "a": 1e300, "b": int("9" * 100), "c": 0.0}


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_same_value_as_json_loads(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert loads_bounded(text, where="x") == json.loads(text)


def test_parse_bounded_is_the_same_reader_with_a_plain_value_error() -> None:
    """The face for callers that add their own context (a metrics line's file and line)."""
    for text in BOMBS.values():
        with pytest.raises(ValueError) as info:
            parse_bounded(text)
        assert not isinstance(info.value, ManifestError) and len(str(info.value)) < 300


def test_parse_bounded_options() -> None:
    # allow_nan: NaN, Infinity and a float that overflows (inf, as a metrics writer means it)
    assert parse_bounded('[NaN, Infinity, 1e999, -1e999]', allow_nan=True)[1:] == [float("inf"), float("inf"),
                                                                                   -float("inf")]
    with pytest.raises(ValueError, match="more than 100"):
        parse_bounded("[" + "9" * 401 + "]")
    assert parse_bounded("[" + "9" * 401 + "]", max_digits=1000) == [10**401 - 1]
    with pytest.raises(ValueError, match="digits"):
        parse_bounded("[" + "9" * 5000 + "]", max_digits=10**6)  # never past Python's int-string limit
    with pytest.raises(ValueError, match="float"):
        parse_bounded("[1e999]", max_digits=1000)

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError("repeated key")
        return dict(pairs)

    with pytest.raises(ValueError, match="repeated key"):
        parse_bounded('{"a": 1, "a": 2}', object_pairs_hook=no_repeats)
    assert parse_bounded('{"a": 1}', object_pairs_hook=no_repeats) == {"a": 1}
