"""What the bundle leaves out, in one place: Qt modules the app does not use, transformers' model families it
does not load, torch's tests and headers, bitsandbytes libraries for other CUDA versions or other vendors."""

from __future__ import annotations

import re
import subprocess
from pathlib import PurePath

# The app uses QtCore, QtGui, QtWidgets and QtCharts (the engine panel's charts; it links QtOpenGL and
# QtOpenGLWidgets). tests/packaging checks that nothing the app imports is on this list.
UNUSED_QT = ["Qt3DAnimation", "Qt3DCore", "Qt3DExtras", "Qt3DInput", "Qt3DLogic", "Qt3DRender", "QtBluetooth",
             "QtDataVisualization", "QtGraphs", "QtHttpServer", "QtLocation", "QtMultimedia",
             "QtMultimediaWidgets", "QtNetworkAuth", "QtNfc", "QtPdf",
             "QtPdfWidgets", "QtPositioning", "QtQml", "QtQuick", "QtQuick3D", "QtQuickControls2", "QtQuickWidgets",
             "QtRemoteObjects", "QtScxml", "QtSensors", "QtSerialBus", "QtSerialPort", "QtSpatialAudio", "QtSql",
             "QtStateMachine", "QtSvgWidgets", "QtTest", "QtTextToSpeech", "QtUiTools", "QtWebChannel",
             "QtWebEngineCore", "QtWebEngineQuick", "QtWebEngineWidgets", "QtWebSockets", "QtWebView", "QtDesigner",
             "QtHelp", "QtCanvasPainter"]
EXCLUDED_MODULES = [
    *(f"PySide6.{name}" for name in UNUSED_QT),
    "tkinter", "matplotlib", "IPython", "pytest", "hypothesis", "ruff", "torchvision", "torchaudio",
    "tensorboard", "triton", "llama_cpp", "llm", "pandas", "scipy", "sklearn",
]

# Libraries with no PyInstaller hook that read their own data files or metadata when imported: kernels (a
# dependency of transformers since 5.25; transformers imports it when it reads a tokenizer) opens a JSON file
# beside its code and asks importlib.metadata for its version.
LIBRARIES_WITH_DATA = ["kernels"]

# The families the engine runs (engine.models.weights_check.LAYER_TENSORS) plus what their GGUF and tokenizer
# paths import; any other Hugging Face architecture is refused by the engine anyway.
TRANSFORMERS_FAMILIES = {"auto", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt2"}

_TORCH_NOISE = re.compile(r"(^|/)torch/(test|include|share/cmake)(/|$)|(^|/)torch/lib/lib\w*test\w*\.so$"
                          r"|(^|/)torch/lib/lib(backend_with_compiler|aoti_custom_ops)\.so$"
                          r"|(^|/)torch/bin/(?!torch_shm_manager)")  # C++ test binaries and protoc
# Qt plugins for what a desktop chat window never uses: kiosk platforms (EGLFS, framebuffer, VNC, Vulkan display)
# and their input drivers, the GTK3 theme (it would pull in GTK), the virtual keyboard (QML), PDF images, network
# information and TLS backends (the app does no networking through Qt).
_UNUSED_QT_PLUGINS = re.compile(
    r"(^|/)PySide6/Qt/plugins/(platformthemes/libqgtk3|platforminputcontexts/libqtvirtualkeyboardplugin"
    r"|imageformats/libqpdf|platforms/libq(eglfs|linuxfb|vnc|vkkhrdisplay|minimalegl)\."
    r"|egldeviceintegrations/|generic/|networkinformation/|tls/)")
# Libraries taken from the system rather than the build machine: fontconfig must match the system's font
# configuration (a bundled copy finds no config file on a system whose layout differs), freetype goes with it.
_SYSTEM_LIBRARIES = re.compile(r"^(libfontconfig\.so\.1|libfreetype\.so\.6)$")
_BNB_LIBRARY = re.compile(r"libbitsandbytes_(\w+?)\.(so|dll|dylib)$")


def keep_file(destination: str, cuda: str | None) -> bool:
    """Whether a file bound for ``destination`` in the bundle is kept; ``cuda`` is the bundled torch's CUDA
    version ("12.8"), or None for the CPU build."""
    path = PurePath(destination).as_posix()
    if _TORCH_NOISE.search(path) or _UNUSED_QT_PLUGINS.search(path) or _SYSTEM_LIBRARIES.match(path):
        return False
    if f"/{path}".find("/torch/") >= 0 and path.endswith((".h", ".hpp", ".cuh", ".pyi")):
        return False
    match = _BNB_LIBRARY.search(path)
    if match:
        flavour = match.group(1)
        wanted = {"cpu", "mps"} | ({f"cuda{cuda.replace('.', '')}"} if cuda else set())
        return flavour in wanted
    return True


def _needed(path: str) -> set[str]:
    """The sonames an ELF file asks the dynamic linker for (its DT_NEEDED entries)."""
    done = subprocess.run(["readelf", "-d", "--wide", path], capture_output=True, text=True, check=False)
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", done.stdout))


def prune_unreachable(binaries: list[tuple]) -> list[tuple]:
    """Linux: drop the shared libraries at the bundle's top and in Qt's lib folder that no kept file needs any
    more (what the removed plugins and bitsandbytes libraries pulled in). Extension modules, torch's and Qt's
    plugins are the roots; the Python library is loaded by the bootloader and always stays."""
    def prunable(entry) -> bool:
        dest = PurePath(entry[0]).as_posix()
        top = "/" not in dest or dest.startswith("PySide6/Qt/lib/")
        return top and entry[2] != "EXTENSION" and not PurePath(dest).name.startswith("libpython")

    kept_names: set[str] = set()
    pending = [entry for entry in binaries if not prunable(entry)]
    candidates = {entry[0]: entry for entry in binaries if prunable(entry)}
    kept = {entry[0] for entry in pending}
    while pending:
        entry = pending.pop()
        if entry[2] == "SYMLINK":
            target = (PurePath(entry[0]).parent / entry[1]).as_posix()
            names = {PurePath(target).name}
        else:
            names = _needed(entry[1])
        new = names - kept_names
        kept_names |= new
        for dest, candidate in candidates.items():
            if dest not in kept and PurePath(dest).name in new:
                kept.add(dest)
                pending.append(candidate)
    return [entry for entry in binaries if entry[0] in kept]


def drop_dangling_symlinks(binaries: list[tuple], datas: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """The TOCs without the symlinks PyInstaller made to files the rules above removed."""
    present = {PurePath(entry[0]).as_posix() for entry in (*binaries, *datas)}

    def resolves(entry) -> bool:
        return entry[2] != "SYMLINK" or (PurePath(entry[0]).parent / entry[1]).as_posix() in present

    return [e for e in binaries if resolves(e)], [e for e in datas if resolves(e)]
