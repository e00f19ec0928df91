"""The forwarding reads a request's model and stream flag (`forwarding.parse_request`) exactly
as `json.loads` reads them, whichever way it takes: for any body (objects of every JSON value,
keys repeated, text beyond ASCII, bytes that are not UTF-8, `NaN`, other encodings, arrays,
bodies cut short or nested past the recursion limit) it gives what the `json.loads` reading
gives, the same model and flag or the same 400."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response

from llmgw_twin.service.router.reading import _parse_slowly, parse_request

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
keys = st.sampled_from(["model", "stream", "messages", "max_tokens", "m\u00f6del", ""])


def _same(raw: bytes) -> None:
    fast, slow = parse_request(raw), _parse_slowly(raw)
    if isinstance(slow, Response):
        assert isinstance(fast, Response), (raw, fast)
        assert (fast.status_code, bytes(fast.body)) == (slow.status_code, bytes(slow.body))
    else:
        assert fast == slow, raw


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(keys, values), max_size=5))
def test_any_object_is_read_as_json_loads_reads_it(pairs: list[tuple[str, object]]) -> None:
    # written pair by pair: a key may come twice (the last one counts)
    body = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}"
    _same(body.encode())
    _same(body.encode("utf-16"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), values)
def test_any_bytes_are_read_as_json_loads_reads_them(junk: bytes, value: object) -> None:
    _same(junk)
    text = json.dumps({"model": "m", "x": value, "stream": True})
    _same(text.encode())
    _same(text.encode()[:-1])  # cut short
    _same(text.encode()[:10] + junk + text.encode()[10:])


def test_the_bodies_each_way_tells_apart() -> None:
    deep = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for raw in [
        b'{"model": "chat", "stream": true}',
        b'{"model": "chat", "model": "code"}',
        b'{"model": "chat", "x": "\xff"}',  # not UTF-8 where a skipped field is
        b'{"model": "\xed\xa0\x80"}',  # a surrogate, as json.loads lets it by
        b'{"model": "chat", "x": NaN}',
        b"\xef\xbb\xbf" + b'{"model": "chat"}',  # a byte-order mark
        b"[" * 100_000 + b"]" * 100_000,
        deep,
        b'{"model": ""}',
        b'{"model": 3, "stream": 1}',
        b"",
    ]:
        _same(raw)
    assert parse_request(b'{"model": "chat", "model": "code", "stream": true}') == ("code", True)
    refused = parse_request(deep)
    assert isinstance(refused, Response) and b"nested too deep" in bytes(refused.body)
