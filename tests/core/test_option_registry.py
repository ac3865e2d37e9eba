"""The options registry (``sx.config``): types, environment mirrors, precedence and errors."""

import math
import re
from pathlib import Path

import pytest

from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.core.option_registry import (
    Choice,
    ChoiceOrInteger,
    Directory,
    Integer,
    Number,
    Option,
    Options,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "options.md"

# Two valid environment values per kind of option, and what the option reads from each.
VALID = {
    Choice: lambda kind: [(f" {c.upper()} ", c) for c in (kind.choices[-1], kind.choices[0])],
    Integer: lambda kind: [(f" {kind.minimum + n} ", kind.minimum + n) for n in (3, 5)],
    ChoiceOrInteger: lambda kind: [(" ALL ", "all"), (f"{kind.integer.minimum + 2}",
                                                      kind.integer.minimum + 2)],
    Number: lambda kind: [(f"{kind.minimum + n}", kind.minimum + n) for n in (0.5, 1.5)],
    Directory: lambda kind: [(f"/tmp/stratax-{n}", f"/tmp/stratax-{n}") for n in ("a", "b")],
}


@pytest.fixture
def fresh():
    yield config
    config.reset()


def _registry():
    return Options([Option("depth", "STRATAX_TEST_DEPTH", Integer(0, "batches ahead"), 2,
                           "Depth."),
                    Option("mode", "STRATAX_TEST_MODE", Choice(("auto", "off"), "a mode"),
                           "auto", "Mode.")])


@pytest.mark.parametrize("option", list(config), ids=lambda option: option.name)
def test_every_option_is_typed_and_mirrored_by_its_variable(monkeypatch, fresh, option):
    assert option.env == "STRATAX_" + option.name.upper()
    assert getattr(env, option.env) == option.env  # named in the one module of names
    assert option.doc
    monkeypatch.delenv(option.env, raising=False)
    assert getattr(config, option.name) == option.default
    (text, value), (other_text, other) = VALID[type(option.kind)](option.kind)
    monkeypatch.setenv(option.env, text)
    got = getattr(config, option.name)
    assert got == value and type(got) is type(value)
    # update wins over the variable, and reset gives it back.
    config.update(option.name, other)
    assert config.updates() == {option.name: other}
    assert getattr(config, option.name) == other
    config.reset(option.name)
    assert config.updates() == {}
    assert getattr(config, option.name) == value
    monkeypatch.setenv(option.env, other_text)
    assert getattr(config, option.name) == other


def test_precedence_explicit_then_update_then_environment_then_default(monkeypatch):
    options = _registry()
    monkeypatch.delenv("STRATAX_TEST_DEPTH", raising=False)
    assert options.depth == 2
    assert options.get("depth", default=7) == 7  # a default decided by the caller
    monkeypatch.setenv("STRATAX_TEST_DEPTH", "3")
    assert options.depth == 3
    assert options.get("depth", default=7) == 3
    options.update("depth", 4)
    assert options.depth == 4
    assert options.get("depth", 5) == 5
    assert options.get("depth", None) == 4  # None is "not given"
    options.reset()
    assert options.depth == 3


def test_origin_names_where_the_value_comes_from(monkeypatch):
    """What an error names as the user's setting follows the same order as the value."""
    options = _registry()
    monkeypatch.delenv("STRATAX_TEST_DEPTH", raising=False)
    assert options.origin("depth") == "default"
    monkeypatch.setenv("STRATAX_TEST_DEPTH", " ")
    assert options.origin("depth") == "default"  # a blank variable is unset
    monkeypatch.setenv("STRATAX_TEST_DEPTH", "3")
    assert options.origin("depth") == "STRATAX_TEST_DEPTH"
    options.update("depth", 4)
    assert options.origin("depth") == "sx.config"
    assert options.origin("depth", 5) == "argument"


def test_the_real_registry_follows_the_same_order(monkeypatch, fresh):
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "shm")
    assert config.cpu_collectives == "shm"
    config.update("cpu_collectives", "Gloo")
    assert config.cpu_collectives == "gloo"
    assert config.get("cpu_collectives", "mpi") == "mpi"


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("sharded_update", "sometimes", "one of 'auto', 'off'"),
    ("sharded_update", 1, "one of 'auto', 'off'"),
    ("prefetch_depth", -1, r"an integer >= 0 \(batches fit places ahead of the step; 0 = off\)"),
    ("prefetch_depth", True, "an integer >= 0"),
    ("prefetch_depth", 2.0, "an integer >= 0"),
    ("shm_slot_bytes", 63, "an integer >= 64"),
    ("shm_spin_us", math.nan, "a number >= 0"),
    ("ps_chief_timeout_seconds", 1, "a number >= 3"),
    ("ps_progress_seconds", "10", "a number >= 0"),
    ("extension_cache", "", "a non-empty path"),
    ("ps_worker_threads", 0, r"one of 'auto', 'all' or an integer >= 1"),
    ("ps_worker_threads", "some", r"one of 'auto', 'all' or an integer >= 1"),
])
def test_a_bad_value_names_the_option_the_value_and_what_it_accepts(fresh, name, value,
                                                                     accepted):
    option = config.option(name)
    message = (rf"^stratax option '{name}' cannot be {re.escape(repr(value))}; it accepts "
               rf"{accepted}.*Environment equivalent: {option.env}\.$")
    with pytest.raises(ValueError, match=message):
        config.update(name, value)
    with pytest.raises(ValueError, match=message):
        config.get(name, value)
    assert config.updates() == {}


def test_a_bad_variable_is_named_with_its_fix(monkeypatch):
    monkeypatch.setenv("STRATAX_SHARDED_UPDATE", "yes")
    with pytest.raises(ValueError, match=r"^STRATAX_SHARDED_UPDATE='yes' is not a sharded-update "
                                         r"setting; use one of auto, off \(or unset it for auto\)"):
        config.sharded_update  # noqa: B018


def test_an_unknown_option_lists_the_options(fresh):
    with pytest.raises(ValueError, match=r"Unknown stratax option 'prefetch'; the options are "
                                         r"cpu_collectives, extension_cache, "):
        config.update("prefetch", 2)
    with pytest.raises(AttributeError, match="stratax has no option 'prefetch'"):
        config.prefetch  # noqa: B018
    assert "prefetch_depth" in dir(config)


def test_paths_are_kept_as_strings(fresh, tmp_path):
    config.update("ps_snapshot_dir", tmp_path)
    assert config.ps_snapshot_dir == str(tmp_path)


def test_sx_config_is_the_registry(monkeypatch, fresh):
    import stratax as sx

    monkeypatch.delenv("STRATAX_PREFETCH_DEPTH", raising=False)
    assert sx.config.prefetch_depth is None
    sx.config.update("prefetch_depth", 4)
    assert sx.config.prefetch_depth == 4 == config.prefetch_depth
    sx.config.reset("prefetch_depth")
    assert sx.config.prefetch_depth is None
    names = dir(sx.config)
    assert {"update", "reset", "prefetch_depth", "experimental_connect_to_cluster"} <= set(names)
    # What an editor offers is the public API and the options, no registry internals.
    assert names == sorted({"update", "reset", "experimental_connect_to_cluster",
                            *(option.name for option in config)})
    with pytest.raises(AttributeError, match="has no attribute '_options'; the options are"):
        sx.config._options  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'origin'"):
        sx.config.origin  # noqa: B018


def test_docs_list_every_option_and_every_bare_variable():
    text = DOCS.read_text()
    for option in config:
        assert f"`{option.name}`" in text and f"`{option.env}`" in text, option.name
    names = {value for key, value in vars(env).items()
             if key.startswith("STRATAX_") and isinstance(value, str)}
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert not missing, f"docs/options.md does not list {missing}"
