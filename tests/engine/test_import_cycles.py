"""No two modules of the engine import each other, directly or round a loop, at module level or inside a function
(a function-level import that cuts a cycle only hides it: the pure part both sides need belongs in its own module)."""

from tests.helpers.import_graph import cycles, import_graph


def test_the_engine_has_no_import_cycles():
    assert cycles(import_graph("engine")) == []


def test_the_check_finds_a_cycle_cut_by_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from .a import other\n")
    (package / "c.py").write_text("from . import a\n")
    assert cycles(import_graph("pkg", tmp_path)) == [["pkg.a", "pkg.b"]]
