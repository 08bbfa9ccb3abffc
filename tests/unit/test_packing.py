"""Large records compressed on their way into Redis (`workers.packing`), and read back by any reader."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers import packing
from workers.contract import ToolOutcome, dump_tool_outcome, parse_tool_outcome
from workers.settings import WorkerSettings


@pytest.fixture(autouse=True)
def compressing() -> Iterator[None]:
    was = packing.is_compressing()
    packing.use_compression(True)
    yield
    packing.use_compression(was)


def json_result(rows: int) -> str:
    # What a tool returns in earnest: records repeating their keys, not random bytes.
    return json.dumps(
        [{"id": i, "name": f"item {i}", "price": i * 1.25, "tags": ["a", "b"]} for i in range(rows)]
    )


def test_a_large_record_is_stored_compressed_and_read_back_whole() -> None:
    text = json_result(200)
    stored = packing.pack(text)
    assert isinstance(stored, bytes) and stored.startswith(packing.MARKER)
    assert packing.stored_size(stored) < len(text) / 4
    assert packing.unpack(stored) == text


def test_a_reader_that_decodes_replies_gets_the_same_record() -> None:
    # A client decoding replies with surrogateescape (`build_redis_options`) hands over text, not bytes.
    stored = packing.pack(json_result(100))
    assert isinstance(stored, bytes)
    assert packing.unpack(stored.decode("utf-8", "surrogateescape")) == json_result(100)


def test_small_records_and_records_written_before_stay_plain() -> None:
    small = '{"ok":true,"result":"4"}'
    assert packing.pack(small) == small
    assert packing.unpack(small) == small and packing.unpack(small.encode()) == small


def test_with_compression_off_large_records_are_written_plain_and_still_read() -> None:
    text = json_result(200)
    stored = packing.pack(text)
    WorkerSettings(compression="off")
    assert packing.pack(text) == text
    assert packing.unpack(stored) == text  # what was written compressed stays readable
    WorkerSettings()
    assert packing.pack(text) == stored


def test_an_unknown_compression_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="compression"):
        WorkerSettings(compression="zstd")  # type: ignore[arg-type]


def test_a_damaged_record_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="does not decompress"):
        packing.unpack(packing.MARKER + b"not zlib at all")


def test_a_large_tool_outcome_round_trips_through_its_stored_form() -> None:
    result = json_result(150)
    outcome = ToolOutcome(call_id="t/c", tool="search", turn_id="t", ok=True, result=result, content=result)
    stored = packing.pack(dump_tool_outcome(outcome))
    assert isinstance(stored, bytes)
    assert parse_tool_outcome(stored) == outcome
    assert parse_tool_outcome(stored.decode("utf-8", "surrogateescape")) == outcome


@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=3000))
def test_any_record_round_trips(text: str) -> None:
    record = json.dumps({"content": text}, ensure_ascii=False)
    assert packing.unpack(packing.pack(record)) == record
