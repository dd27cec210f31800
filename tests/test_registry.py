import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcomm.errors import ConfigError, RegistryError
from dlcomm.registry import Registry, Spec, parse_rate, parse_size, parse_spec

names = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
values = st.from_regex(r"[A-Za-z0-9.]{1,8}", fullmatch=True)


@given(names, st.dictionaries(names, values, max_size=4))
def test_spec_round_trips(name, options):
    spec = Spec(name, options)
    assert parse_spec(str(spec)) == spec


def test_spec_errors():
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_spec("synthetic:tensors")
    with pytest.raises(ConfigError, match="empty name"):
        parse_spec(":a=1")


@pytest.mark.parametrize("text,expected", [
    ("1000", 1000), ("4K", 4000), ("100MB", 100_000_000), ("1GiB", 2**30), ("2.5M", 2_500_000),
    ("1M", 10**6), ("25mb", 25_000_000)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "MB", "1.5", "-3", "ten"])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError):
        parse_size(bad)


@pytest.mark.parametrize("text,expected", [("100mbit", 1e8), ("1gbit", 1e9), ("10Gbit", 1e10),
                                           ("500kbit", 5e5)])
def test_parse_rate(text, expected):
    assert parse_rate(text) == expected


def test_registry_unknown_name_lists_known():
    reg: Registry[int] = Registry("widget")
    reg.register("a", "first")(lambda: 1)
    reg.register("b", "second")(lambda: 2)
    with pytest.raises(RegistryError, match=r"unknown widget 'c' \(known: a, b\)"):
        reg.get("c")
    assert reg.check("a:x=1") == Spec("a", {"x": "1"})
    assert list(reg) == ["a", "b"] and "a" in reg and reg.doc("b") == "second"
    with pytest.raises(ValueError, match="twice"):
        reg.register("a")(lambda: 3)


@pytest.mark.parametrize("bad", ["10", " 2.5 ", "fast", "-1gbit", ""])
def test_parse_rate_wants_a_unit(bad):
    with pytest.raises(ConfigError, match="no unit|bad rate"):
        parse_rate(bad)
    assert parse_rate("10bit") == 10 and parse_rate("2.5g") == 2.5e9
