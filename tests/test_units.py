"""Durations, sizes and the human time format (`twin.units`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw_twin.units import fmt_duration, fmt_ms, parse_duration, parse_size_mib


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1500ms", 1_500),
        ("90s", 90_000),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("1h30m", 5_400_000),
        ("1h30m15s500ms", 5_415_500),
        ("2m5s", 125_000),
        ("0s", 0),
        ("0ms", 0),
        ("0", 0),
        ("90m", 5_400_000),
        ("1m0s", 60_000),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty duration"),
        ("-5s", "negative"),
        ("-0s", "negative"),
        ("90", "number without a unit"),
        ("1m30", "number without a unit"),
        ("5x", "unknown unit 'x'"),
        ("5min", "unknown unit 'min'"),
        ("5S", "unknown unit 'S'"),
        ("30m1h", "out of order"),
        ("1s1m", "out of order"),
        ("500ms1s", "out of order"),
        ("1m1m", "repeated"),
        ("1s2s", "repeated"),
        ("1.5s", "unexpected '.'"),
        ("s", "unexpected 's'"),
        (" 5s", "unexpected ' '"),
        ("5s ", "unexpected ' '"),
        ("+5s", "unexpected '+'"),
        ("\u0661s", "unexpected"),  # only ASCII digits (ARABIC-INDIC ONE)
    ],
)
def test_parse_duration_rejects(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match="duration") as info:
        parse_duration(text)
    assert complaint in str(info.value)


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("80GiB", 81_920),
        ("512MiB", 512),
        ("1TiB", 1_048_576),
        ("2048KiB", 2),
        ("1.5GiB", 1_536),
        ("0MiB", 0),
    ],
)
def test_parse_size(text: str, mib: int) -> None:
    assert parse_size_mib(text) == mib


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty size"),
        ("80", "number without a unit"),
        ("80GB", "unknown unit 'GB'"),
        ("80G", "unknown unit 'G'"),
        ("80gib", "unknown unit 'gib'"),
        ("1KiB", "not a whole number of MiB"),
        ("1.0001MiB", "not a whole number of MiB"),
        ("-1GiB", "negative"),
        ("GiB", "cannot read size"),
        ("1 GiB", "cannot read size"),
    ],
)
def test_parse_size_rejects(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match="size") as info:
        parse_size_mib(text)
    assert complaint in str(info.value)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0.000s"),
        (1, "0.001s"),
        (59_250, "59.250s"),
        (60_000, "1m00.000s"),
        (125_500, "2m05.500s"),
        (3_600_000, "1h00m00.000s"),
        (3_723_000, "1h02m03.000s"),
        (100 * 3_600_000, "100h00m00.000s"),
        (-1_500, "-1.500s"),
    ],
)
def test_fmt_ms(ms: int, text: str) -> None:
    assert fmt_ms(ms) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (1_500, "1s500ms"), (5_400_000, "1h30m"), (5_415_500, "1h30m15s500ms")],
)
def test_fmt_duration(ms: int, text: str) -> None:
    assert fmt_duration(ms) == text


def test_fmt_duration_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        fmt_duration(-1)


@given(st.integers(min_value=0, max_value=10**12))
def test_duration_round_trip(ms: int) -> None:
    assert parse_duration(fmt_duration(ms)) == ms


@given(st.text(max_size=12))
def test_parse_duration_only_raises_value_error(text: str) -> None:
    try:
        ms = parse_duration(text)
    except ValueError:
        return
    assert ms >= 0
