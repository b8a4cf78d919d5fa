"""The encoding registry: subclass registration, duplicates, did-you-mean errors, entry points, options."""

from __future__ import annotations

import pytest
import torch

import posbench.registry
from posbench.encodings import ENCODINGS, PositionalEncoding
from posbench.model import ModelConfig, Transformer
from posbench.options import Option, OptionError, positive
from posbench.registry import Registry, UnknownNameError

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN

pytestmark = pytest.mark.usefixtures("one_thread")


def small_config(encoding: str, **options) -> ModelConfig:
    return ModelConfig(vocab_size=20, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, encoding=encoding,
                       encoding_options=options)


def test_every_file_of_the_encodings_folder_is_imported_and_registers_its_encodings():
    """Discovery, not a list: each module in ``posbench/encodings/`` (but the contract, ``base``) defines at least
    one registered encoding of built-in origin, and every built-in encoding comes from one of them."""
    import inspect
    from pathlib import Path

    import posbench.encodings

    folder = Path(posbench.encodings.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "base"}
    homes = {ENCODINGS[name].__module__.rsplit(".", 1)[1] for name in BUILTIN}
    assert homes == modules
    for name in BUILTIN:
        cls = ENCODINGS[name]
        assert cls.name == name and ENCODINGS.origin(name) == "built-in"
        assert Path(inspect.getfile(cls)).parent == folder
    assert {"rope", "alibi", "tape"} <= set(BUILTIN)


def test_subclass_registers_itself():
    class Dummy(PositionalEncoding):
        name = "test-dummy"

    try:
        assert ENCODINGS["test-dummy"] is Dummy
        assert "test-dummy" in ENCODINGS
        assert ENCODINGS.origin("test-dummy") == f"user ({__name__})"
        model = Transformer(small_config("test-dummy"))
        assert isinstance(model.encoding, Dummy)
    finally:
        ENCODINGS.remove("test-dummy")
    assert "test-dummy" not in ENCODINGS


def test_an_abstract_subclass_without_name_is_not_registered():
    before = set(ENCODINGS)

    class Abstract(PositionalEncoding):  # no name: an intermediate base class, which says so
        abstract = True

    assert set(ENCODINGS) == before


def test_duplicate_name_is_refused():
    with pytest.raises(ValueError, match="'rope' is already registered by posbench.encodings.rope.RoPE"):
        class Impostor(PositionalEncoding):
            name = "rope"
    assert ENCODINGS["rope"].__module__ == "posbench.encodings.rope"


def test_registry_add_same_class_twice_is_fine_and_bad_names_refused():
    reg: Registry = Registry("widget")
    reg.add("a", int)
    reg.add("a", int)
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", float)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", int)


@pytest.mark.parametrize("typo, suggestion", [("ropee", "rope"), ("alibj", "alibi"), ("tap", "tape"),
                                              ("xpso", "xpos")])
def test_unknown_name_suggests_closest_and_lists_valid(typo, suggestion):
    with pytest.raises(UnknownNameError) as info:
        ENCODINGS.get(typo)
    message = str(info.value)
    assert f"Did you mean '{suggestion}'?" in message
    assert "Valid: " + ", ".join(BUILTIN) in message
    assert "\n" not in message
    assert isinstance(info.value, KeyError)  # a Mapping's missing key


def test_unknown_name_far_from_everything_has_no_suggestion():
    with pytest.raises(UnknownNameError) as info:
        ENCODINGS["completely-different"]
    assert "Did you mean" not in str(info.value)
    assert "unknown encoding 'completely-different'" in str(info.value)


def test_model_with_unknown_encoding_raises_the_registry_error():
    with pytest.raises(UnknownNameError, match="Did you mean 'fire'"):
        Transformer(small_config("fier"))


class FakeDist:
    name = "posbench-plugin-demo"


class FakeEntryPoint:
    """Stands in for an ``importlib.metadata.EntryPoint``: ``load()`` imports the plugin's module, whose
    class definition registers itself, and returns the class."""

    def __init__(self, name: str, loader):
        self.name, self.value, self.dist, self._loader = name, f"demo_plugin:{name}", FakeDist(), loader
        self.loads = 0

    def load(self):
        self.loads += 1
        return self._loader()


def _define_plugin_class():
    class Sinusoidal(PositionalEncoding):
        name = "plugin-sincos"
        OPTIONS = {"base": Option(10000.0, "the sinusoids' base", positive())}

        def init_state(self, positions, tokens, memory):
            return positions

        def embed(self, x, positions):
            half = self.d_model // 2
            freq = self.options["base"] ** (-torch.arange(half, dtype=torch.float32) / half)
            angle = positions[..., None].float() * freq
            return x + torch.cat((angle.sin(), angle.cos()), dim=-1)

    return Sinusoidal


def test_entry_point_plugins_are_loaded_on_first_read(monkeypatch):
    calls = []
    point = FakeEntryPoint("plugin-sincos", _define_plugin_class)

    def fake_entry_points(*, group):
        calls.append(group)
        return [point] if group == "posbench.encodings" else []

    monkeypatch.setattr(posbench.registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(ENCODINGS, "_plugins_loaded", False)
    try:
        assert "plugin-sincos" in ENCODINGS
        assert calls == ["posbench.encodings"]
        assert ENCODINGS.origin("plugin-sincos") == "plugin (posbench-plugin-demo)"
        list(ENCODINGS)
        assert point.loads == 1 and len(calls) == 1  # loaded once, not on every read
        model = Transformer(small_config("plugin-sincos", base=500))
        assert model.config.encoding_options == {"base": 500.0}
        logits = model(torch.randint(0, 20, (1, 8)))
        assert torch.isfinite(logits).all()
    finally:
        ENCODINGS.remove("plugin-sincos")


def test_entry_point_whose_class_does_not_self_register(monkeypatch):
    """A plugin may point at a class that its module did not register: the registry adds it under its name."""
    reg: Registry = Registry("encoding", entry_point_group="posbench.encodings")

    class Loose:
        name = "loose"

    monkeypatch.setattr(posbench.registry, "entry_points", lambda *, group: [FakeEntryPoint("loose-ep", lambda: Loose)])
    assert reg["loose"] is Loose
    assert reg.origin("loose") == "plugin (posbench-plugin-demo)"


def test_resolved_options_are_recorded_in_the_config():
    model = Transformer(small_config("rope", theta=500))
    assert model.config.encoding_options == {"theta": 500.0, "scale": 1.0, "random_offset": False}
    assert isinstance(model.config.encoding_options["theta"], float)
    tape = Transformer(small_config("tape"))
    assert tape.config.encoding_options["position_size"] == 4 * 4  # I defaults to 4 x heads
    assert tape.config.encoding_options["gate"] == "rowsum"
    assert tape.config.to_dict()["encoding_options"] == tape.encoding.options
    t5 = Transformer(small_config("t5", num_buckets="32"))  # strings from a command line are coerced
    assert t5.config.encoding_options == {"num_buckets": 32, "max_distance": 128, "table_init": "t5",
                                         "scale": 1.0}  # T5's own: unscaled
    t5 = Transformer(small_config("t5", table_init="x-transformers"))
    assert t5.config.encoding_options["scale"] == 8 ** 0.5                      # sqrt(head dim)
    randpe = Transformer(small_config("randpe", per_layer="true"))
    assert randpe.config.encoding_options["per_layer"] is True


@pytest.mark.parametrize("encoding, options, message", [
    ("rope", {"thetta": 1.0}, "encoding 'rope' has no option thetta (did you mean 'theta'?); valid options: "
                              "random_offset, scale, theta"),
    ("alibi", {"slope": 1.0}, "encoding 'alibi' has no option slope; valid options: none"),
    ("rope", {"theta": "ten"}, "option theta='ten': expected a number"),
    ("rope", {"theta": True}, "option theta=True: expected a number"),
    ("t5", {"num_buckets": 2.5}, "option num_buckets=2.5: expected an integer"),
    ("randpe", {"per_layer": "maybe"}, "option per_layer='maybe': expected true or false"),
    ("tape", {"gate": 3}, "option gate=3: expected text"),
    ("tape", {"gate": "mixing"}, "option gate='mixing' is out of range: it must be one of rowsum, scalar"),
    ("rope", {"theta": -3}, "option theta=-3.0 is out of range: it must be > 0"),
    ("xpos", {"gamma": 0}, "option gamma=0.0 is out of range: it must be > 0"),
    ("fire", {"c": 0}, "option c=0.0 is out of range: it must be > 0"),
    ("randpe", {"range_factor": 0}, "option range_factor=0 is out of range: it must be >= 1"),
    ("t5", {"max_distance": 16}, "max_distance=16 is out of range: it must be > num_buckets / 2 (32)"),
    ("tape", {"scale": float("nan")}, "option scale=nan is out of range: it must be > 0"),
])
def test_bad_options_are_refused_in_one_line(encoding, options, message):
    with pytest.raises(OptionError) as info:
        Transformer(small_config(encoding, **options))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# ---- the three ways in: a folder, --plugins, entry points (end to end in tests/test_plugins.py) ----------------
def test_a_plugin_that_cannot_be_imported_is_one_line(capsys, monkeypatch, tmp_path):
    from posbench.cli import main

    monkeypatch.delenv("POSBENCH_PLUGINS", raising=False)     # restored afterwards: no other test sees ours
    monkeypatch.chdir(tmp_path)
    assert main(["--plugins", "no_such_plugin_module", "ls", "encodings"]) == 2
    assert capsys.readouterr().err == "error: plugin 'no_such_plugin_module' cannot be imported " \
                                      "(ModuleNotFoundError: No module named 'no_such_plugin_module')\n"
    (tmp_path / "json.py").write_text("x = 1\n")                # named like a module Python has already imported
    assert main(["--plugins", "json.py", "ls", "encodings"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plugin 'json.py': a module named 'json' is already imported") and \
        err.endswith("rename the file\n")
    assert "POSBENCH_PLUGINS" not in __import__("os").environ   # a plugin that failed is not passed on


def test_a_file_dropped_into_a_folder_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch):
    from posbench.registry import PluginError, import_folder

    folder = tmp_path / "dropin_pkg"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "good.py").write_text("VALUE = 1\n")
    (folder / "broken.py").write_text("def oops(:\n")
    (folder / "_private.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as info:
        import_folder("dropin_pkg", [str(folder)])
    assert str(info.value).startswith("cannot import dropin_pkg.broken (SyntaxError: ")
    assert "\n" not in str(info.value)


def test_a_folder_dropped_into_a_registrys_package_registers_what_its_modules_define(tmp_path, monkeypatch):
    """A folder whose ``__init__.py`` imports nothing (as a built-in task's folder) still registers its classes:
    listing imports every module of every folder; and a registry of a kind posbench does not know lists it too."""
    from posbench.registry import import_folder

    package = tmp_path / "widgets_pkg"
    (package / "mine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mine" / "__init__.py").write_text('"""my widget: task.py"""\n')
    (package / "mine" / "task.py").write_text("import widgets_pkg\nwidgets_pkg.SEEN = 'mine.task'\n")
    (package / "mine" / "_private.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_folder("widgets_pkg", [str(package)])
    import widgets_pkg

    assert widgets_pkg.SEEN == "mine.task"
    assert list(Registry("widget", package="widgets_pkg")) == []       # a kind beyond posbench's: nothing, no error


def test_a_plugin_module_registers_with_its_name_as_origin(monkeypatch, tmp_path):
    """``load_plugins`` imports a module (here by file) once; its classes' origin names it."""
    from posbench.registry import load_plugins

    (tmp_path / "posbench_test_plugin_enc.py").write_text(
        "from posbench.encodings import PositionalEncoding\n\n\n"
        "class Plain(PositionalEncoding):\n    name = 'test-plugin-plain'\n")
    monkeypatch.chdir(tmp_path)
    try:
        load_plugins(["posbench_test_plugin_enc.py"])
        load_plugins(["posbench_test_plugin_enc.py"])                 # once only: no duplicate registration
        assert ENCODINGS.origin("test-plugin-plain") == "plugin (posbench_test_plugin_enc)"
    finally:
        ENCODINGS.remove("test-plugin-plain")
        import sys
        sys.modules.pop("posbench_test_plugin_enc", None)


# ---- a contract that cannot fail in silence (issue 37, item 3) ---------------------------------------------

def test_a_method_that_looks_like_a_misspelled_hook_is_refused():
    for wrong, hook in (("embedd", "embed"), ("init_weight", "init_weights"), ("rotat", "rotate")):
        with pytest.raises(TypeError, match=rf"defines {wrong}\(\), which looks like the hook {hook}\(\) misspelled"):
            type("Misspelled", (PositionalEncoding,), {"name": f"test-{wrong}", wrong: lambda self, *a: None,
                                                        "__module__": __name__})
        assert f"test-{wrong}" not in ENCODINGS


def test_a_subclass_without_a_name_is_refused_unless_abstract():
    with pytest.raises(TypeError, match=r"has no name: set name = '...' \(a base class meant only to be "
                                        r"subclassed sets abstract = True\)"):
        class Forgotten(PositionalEncoding):
            def embed(self, x, state):
                return x

    class Base(PositionalEncoding):
        abstract = True

    class Concrete(Base):
        name = "test-concrete"
    try:
        assert ENCODINGS["test-concrete"] is Concrete
    finally:
        ENCODINGS.remove("test-concrete")


def test_a_file_dropped_into_posbenchs_folder_is_not_listed_as_built_in():
    import posbench.tasks  # noqa: F401  (its SHIPPED)
    from posbench.registry import origin_of

    assert origin_of("posbench.encodings.rope") == "built-in"
    assert origin_of("posbench.tasks.arithmetic.task") == "built-in"
    assert origin_of("posbench.encodings.learned") == "added to posbench (posbench/encodings/learned)"
    assert origin_of("posbench.tasks.copy_task") == "added to posbench (posbench/tasks/copy_task)"
    assert origin_of("my_package.learned") == "user (my_package.learned)"


def test_a_preset_written_as_a_string_or_with_an_unknown_section_names_what_is_valid(tmp_path):
    from posbench.errors import ConfigError
    from posbench.tasks.presets import load_presets

    bad = tmp_path / "bad.toml"
    bad.write_text('tiny = "steps = 20"\n')
    with pytest.raises(ConfigError, match=r"preset 'tiny' is str 'steps = 20', not a table: write \[tiny\]"):
        load_presets(str(bad), "copy")
    odd = tmp_path / "odd.toml"
    odd.write_text("[tiny]\nmodels = { d_model = 32 }\n")
    with pytest.raises(ConfigError, match=r"unknown sections \['models'\]; valid: model, encoding, train, task, "
                                          r"expected, extends"):
        load_presets(str(odd), "copy")


def test_the_extending_guides_presets_file_loads(tmp_path):
    import re
    from pathlib import Path

    from posbench.tasks.presets import load_presets

    text = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    (block,) = re.findall(r"```toml\n(# copy_task.toml.*?)```", text, re.S)
    path = tmp_path / "copy_task.toml"
    path.write_text(block)
    presets = load_presets(str(path), "copy")
    assert set(presets) == {"tiny", "small"}
    assert presets["small"]["train"]["steps"] == 200 and presets["small"]["model"]["d_model"] == 32
