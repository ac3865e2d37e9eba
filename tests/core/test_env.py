"""The one reader of numeric and choice environment variables: values, defaults and the error's
wording."""

import pytest

from stratax._src.core import env


def test_values_are_stripped_and_empty_means_the_default():
    assert env.parse_int("N", " 7 ", 1) == 7
    assert env.parse_int("N", " ", 1, default=5) == 5
    assert env.parse_int("N", "0", 0, default=5) == 0  # 0 is a value, not "unset"


@pytest.mark.parametrize(("value", "kwargs", "message"), [
    ("x", {}, "Environment variable N='x' is not an integer >= 0; set it to an integer >= 0, "
              "e.g. N=1."),
    ("", {"minimum": 2}, "Environment variable N='' is not an integer >= 2; set it to an "
                         "integer >= 2, e.g. N=2."),
    ("1.5", {"minimum": 1, "default": 4, "meaning": "steps"},
     "Environment variable N='1.5' is not an integer >= 1 (steps); set it to an integer >= 1 "
     "or unset it for the default 4."),
    ("-1", {"unset": "for one per host"}, "Environment variable N='-1' is not an integer >= 0; "
                                          "set it to an integer >= 0 or unset it for one per "
                                          "host."),
])
def test_int_error_names_variable_value_expectation_and_fix(value, kwargs, message):
    with pytest.raises(ValueError) as raised:
        env.parse_int("N", value, **kwargs)
    assert str(raised.value) == message


def test_optional_and_defaulted_readers(monkeypatch):
    monkeypatch.delenv("STRATAX_TEST_N", raising=False)
    assert env.get_optional_int("STRATAX_TEST_N", 1) is None
    assert env.get_int_or("STRATAX_TEST_N", 3, 1) == 3
    assert env.get_float_or("STRATAX_TEST_N", 2.5) == 2.5
    monkeypatch.setenv("STRATAX_TEST_N", "8")
    assert env.get_optional_int("STRATAX_TEST_N", 1) == 8
    assert env.get_int_or("STRATAX_TEST_N", 3, 1) == 8
    assert env.get_float_or("STRATAX_TEST_N", 2.5) == 8.0


@pytest.mark.parametrize("value", ["nan", "-0.5", "fast"])
def test_float_error_rejects_nan_and_reads_like_the_int_one(monkeypatch, value):
    monkeypatch.setenv("STRATAX_TEST_N", value)
    with pytest.raises(ValueError) as raised:
        env.get_float_or("STRATAX_TEST_N", 2.5, meaning="seconds")
    assert str(raised.value) == (f"Environment variable STRATAX_TEST_N={value!r} is not a number "
                                 ">= 0 (seconds); set it to a number >= 0 or unset it for the "
                                 "default 2.5.")


def test_choice_reader_ignores_case_and_names_the_choices(monkeypatch):
    monkeypatch.delenv("STRATAX_TEST_CHOICE", raising=False)
    assert env.get_choice("STRATAX_TEST_CHOICE", ("a", "b"), "a", what="a letter") == "a"
    monkeypatch.setenv("STRATAX_TEST_CHOICE", " B ")
    assert env.get_choice("STRATAX_TEST_CHOICE", ("a", "b"), "a", what="a letter") == "b"
    monkeypatch.setenv("STRATAX_TEST_CHOICE", "c")
    with pytest.raises(ValueError, match=r"^STRATAX_TEST_CHOICE='c' is not a letter; use one of "
                                         r"a, b \(or unset it for a\)\.$"):
        env.get_choice("STRATAX_TEST_CHOICE", ("a", "b"), "a", what="a letter")
