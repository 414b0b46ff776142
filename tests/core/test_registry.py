"""The one generic registry: names in any spelling, suggestions, specs, lazy entries."""

from __future__ import annotations

import functools

import pytest

from ctrcal.core.errors import ConfigError, DataError
from ctrcal.core.registry import Registry, closest, normalize_name


def _widget(width, scale=1.0):
    return ("widget", width, scale)


def _registry() -> Registry:
    reg: Registry = Registry("widget")
    reg.register("Big_Widget", _widget, aliases=("bw",))
    reg.register("small", functools.partial(_widget, scale=0.5))
    return reg


@pytest.mark.parametrize("name", ["MC_LayerNorm", "mc-layernorm", "mclayernorm", " MC.Layer Norm "])
def test_one_normaliser(name):
    assert normalize_name(name) == "mclayernorm"


def test_normaliser_refuses_what_is_not_a_string():
    with pytest.raises(TypeError, match="must be a string"):
        normalize_name(3)


def test_any_spelling_and_aliases_find_the_entry_listed_as_registered():
    reg = _registry()
    assert reg.get("big-widget") is _widget and reg.get("BW") is _widget
    assert reg.canonical("bigwidget") == "Big_Widget"
    assert reg.available() == ["Big_Widget", "small"]  # aliases are not listed
    assert "BIG WIDGET" in reg and "nope" not in reg and 3 not in reg
    assert reg.find("nope") is None
    assert [name for name, _ in reg.items()] == ["Big_Widget", "small"]  # registration order


def test_unknown_name_suggests_the_closest_and_lists_all():
    reg = _registry()
    with pytest.raises(ConfigError) as info:
        reg.get("big_widgit")
    assert str(info.value) == (
        "unknown widget 'big_widgit'; did you mean 'Big_Widget'? "
        "(valid: Big_Widget, small (aliases: bw -> Big_Widget))"
    )
    with pytest.raises(ConfigError, match=r"^unknown widget 'zzzzzz' \(valid: "):
        reg.get("zzzzzz")  # nothing close: no suggestion


def test_error_class_and_valid_extra_are_the_registry_s():
    reg: Registry = Registry("schema", error=DataError, valid_extra=", or a file")
    reg.register("criteo", 1)
    with pytest.raises(DataError, match=r"did you mean 'criteo'\? \(valid: criteo, or a file\)"):
        reg.get("criteox")


def test_register_refuses_a_taken_name_unless_overwrite():
    reg = _registry()
    with pytest.raises(ValueError, match="widget 'small' is already registered"):
        reg.register("SMALL", _widget)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("other", _widget, aliases=("bw",))
    reg.register("small", _widget, overwrite=True)
    assert reg.get("small") is _widget
    with pytest.raises(ValueError, match="must not be empty"):
        reg.register(" - ", _widget)


def test_register_as_decorator_and_unregister():
    reg = _registry()

    @reg.register("decorated", aliases=("dec",))
    def made(width):
        return width

    assert reg.get("dec") is made
    reg.unregister("Decorated")
    assert "decorated" not in reg and "dec" not in reg
    reg.unregister("decorated")  # already gone: nothing happens


def test_lazy_entries_are_imported_on_first_lookup_only():
    reg: Registry = Registry("thing", lazy=True)
    reg.register("join", "os.path:join")
    assert reg._entries["join"][1] == "os.path:join"  # listing imports nothing
    import os.path

    assert reg.get("join") is os.path.join
    with pytest.raises(ValueError, match="expected 'package.module:Name'"):
        reg.register("bad", "os.path.join")


def test_create_from_every_spec_form():
    reg = _registry()

    class Spec:  # a NormSpec-like object: name + kwargs
        name, kwargs = "big-widget", {"scale": 3.0}

    assert reg.create("big_widget", 4) == ("widget", 4, 1.0)
    assert reg.create({"name": "BW", "scale": 2.0}, 4) == ("widget", 4, 2.0)
    assert reg.create({"name": "bw", "scale": 2.0}, 4, scale=5.0) == ("widget", 4, 5.0)
    assert reg.create(Spec(), 4) == ("widget", 4, 3.0)
    assert reg.create("small", 4) == ("widget", 4, 0.5)
    assert reg.create(functools.partial(_widget, scale=7.0), 4) == ("widget", 4, 7.0)
    entry, arguments, label = reg.parse_spec({"name": "bw", "scale": 2.0})
    assert (entry, arguments, label) == (_widget, {"scale": 2.0}, "Big_Widget")


def test_bad_specs_name_what_a_spec_is():
    reg = _registry()
    with pytest.raises(ConfigError, match=r"a widget mapping needs 'name: <widget>'"):
        reg.create({"scale": 2.0}, 4)
    with pytest.raises(ConfigError, match="a widget spec is a name or a mapping"):
        reg.parse_spec(_widget, callables=False)
    with pytest.raises(ConfigError, match="unknown widget 'nope'"):
        reg.create({"name": "nope"}, 4)


def test_closest():
    assert closest("layrnorm", ["layernorm", "rmsnorm"]) == "layernorm"
    assert closest("zzz", ["layernorm"]) is None
