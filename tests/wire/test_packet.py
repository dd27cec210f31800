import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.wire.packet import (
    DATA,
    HEADER_SIZE,
    PROBE,
    RESULT,
    STATUS,
    Header,
    Malformed,
    decode,
    encode,
    max_elements,
)

headers = st.builds(Header, st.sampled_from([DATA, RESULT]), st.integers(0, 0xFFFF),
                    st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), st.integers(0, 64),
                    st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
                    st.integers(-32768, 32767), st.integers(0, 2**64 - 1))


@given(headers)
def test_round_trip(header):
    data = encode(header, b"\x01\x02\x03\x04" * header.numel)
    back, payload = decode(data)
    assert back == header and len(payload) == 4 * header.numel
    assert len(data) == HEADER_SIZE + 4 * header.numel


@pytest.mark.parametrize("data,reason", [
    (b"", "truncated"), (b"\xc0\xd1" + bytes(10), "truncated"),
    (bytes(32), "foreign"),
    (Header(DATA, 1, 0, 0, 0, 0, 0, 0, 0).pack()[:2] + b"\x09" + bytes(29), "version"),
])
def test_malformed(data, reason):
    with pytest.raises(Malformed) as err:
        decode(data)
    assert err.value.reason == reason


def test_bad_type_and_length():
    good = Header(DATA, 1, 0, 0, 2, 0, 0, 0, 7)
    raw = bytearray(good.pack())
    raw[3] = 99
    with pytest.raises(Malformed, match="type"):
        decode(bytes(raw))
    with pytest.raises(Malformed, match="length"):
        decode(encode(good, b"\x00" * 7))
    # a probe carries no payload whatever numel says; a status carries a bitmap
    decode(Header(DATA, 1, 0, 0, 2, 0, 0, 0, 7, PROBE).pack())
    decode(Header(STATUS, 1, 0, 0, 0, 0, 0, 0, 7).pack() + b"\x0f")


def test_max_elements_fit_a_datagram():
    assert HEADER_SIZE + 4 * max_elements() <= 65507
