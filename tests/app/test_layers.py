"""app/ is layered: each package imports only from the layers below it, never back up, and no modules import each
other round a loop. The layers, lowest first, are the ones docs/architecture.md draws."""

from tests.helpers.import_graph import cycles, import_graph

LAYERS = [  # lowest first; packages in one layer don't import each other
    {"app.version", "app.resources", "app.units", "app.theme", "app.rich_text"},
    {"app.data"},
    {"app.engines", "app.mcp"},
    {"app.chats"},
    {"app.transcript", "app.panel", "app.dialogs"},
    {"app.window"},
    {"app.startup"},
    {"app.tools", "app.__main__"},
]


def unit_of(module: str) -> str:
    """The package (or top-level module) of app/ that ``module`` belongs to."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int:
    unit = unit_of(module)
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs to a higher layer, or sideways to another package of the same layer."""
    wrong = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            same_unit = unit_of(module) == unit_of(target)
            if not same_unit and layer_of(target) >= layer_of(module):
                wrong.append(f"{module} -> {target}")
    return wrong


def test_every_module_of_the_app_has_a_layer():
    assert [m for m in import_graph("app") if not any(unit_of(m) in layer for layer in LAYERS)] == []


def test_no_import_runs_back_up_the_layers():
    assert upward_imports(import_graph("app")) == []


def test_the_app_has_no_import_cycles():
    assert cycles(import_graph("app")) == []


def test_the_check_sees_an_import_back_up():
    graph = {"app.data.store": {"app.window.main_window"}, "app.window.main_window": {"app.data.store"},
             "app.panel.charts": {"app.dialogs.about"}, "app.dialogs.about": set()}
    assert upward_imports(graph) == ["app.data.store -> app.window.main_window",
                                     "app.panel.charts -> app.dialogs.about"]
