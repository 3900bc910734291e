"""Every kind of bad model file is refused in words, without a raw exception, a hang or a large allocation.

Each case is loaded the way the app loads a model, ``Engine(EngineConfig(model=...))``, in one child process
that runs them all in sequence and reports, per case, the exception's classes and message and how far its
peak resident memory rose above the resident memory before it (Linux: the peak is reset through
/proc/self/clear_refs before each attempt and read from VmHWM after it; where that is not allowed, the growth
of ru_maxrss over the baseline after the imports). A config that lies about its sizes must be refused from the
headers, so no case may raise the peak by 1 GiB (a ``vocab_size`` of 10^8 used to be killed by the kernel for
running out of memory). The one model that is not refused, a tokenizer without a chat template,
is served with a warning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiny_gguf import nested_array_value, write_raw_gguf, write_tiny_llama_gguf

ROOT = Path(__file__).resolve().parents[2]
PEAK_LIMIT_KIB = 1024 * 1024  # 1 GiB
ADDRESS_SPACE_HEADROOM = 3 * 1024**3  # so a regression fails with MemoryError, not the kernel's OOM killer
WARNING = "served with a warning"
F32 = 0


def attempt_all(cases_file: str) -> None:
    """Child process: try to load every case and print one JSON line of outcomes."""
    import resource

    from engine import Engine, EngineConfig  # the imports the attempts use belong to the baseline
    from engine.models.loader import load_model  # noqa: F401

    _limit_address_space(resource)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = {}
    for case_id, spec in json.loads(Path(cases_file).read_text()).items():
        before = _reset_peak()
        try:
            warnings = Engine(EngineConfig(model=spec, num_kv_blocks=16)).stats().warnings
            outcome = {"classes": [], "message": "; ".join(warnings)}
        except Exception as exc:  # noqa: BLE001 - the parent judges what was raised
            outcome = {"classes": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
        now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        outcome["peak_kib"] = _status_kib("VmHWM") - before if before is not None else now - baseline
        outcomes[case_id] = outcome
    print(json.dumps({"baseline_kib": baseline, "outcomes": outcomes}))


def _reset_peak() -> int | None:
    """Reset the kernel's peak-resident counter for this process; resident KiB now, or None if not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _status_kib("VmRSS")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


def _limit_address_space(resource) -> None:
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + ADDRESS_SPACE_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


# -- building the cases -------------------------------------------------------------------------------------


class Cases:
    """Bad model files under one folder: case id -> (kind, model setting, what the refusal must say)."""

    def __init__(self, root: Path, tiny_llama: Path) -> None:
        self.root, self.tiny = root, tiny_llama
        self.table: dict[str, tuple[str, str, str]] = {}

    def add(self, case_id: str, kind: str, spec: str | Path, expected: str) -> None:
        self.table[case_id] = (kind, str(spec), expected)

    def folder(self, name: str, config: dict | None = None, weights: bool = True) -> Path:
        """A copy of the tiny llama folder, its config changed by ``config``; the weights linked, not copied."""
        out = self.root / name
        out.mkdir()
        for f in self.tiny.iterdir():
            if f.suffix != ".safetensors":
                shutil.copy(f, out / f.name)
            elif weights:
                (out / f.name).symlink_to(f)
        saved = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**saved, **(config or {})}))
        return out

    def lying_safetensors(self, name: str, lie) -> Path:
        """The tiny llama folder with its weights' header changed by ``lie(header)``, the data unchanged."""
        out = self.folder(name, weights=False)
        raw = (self.tiny / "model.safetensors").read_bytes()
        length = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + length])
        lie(header)
        encoded = json.dumps(header).encode()
        encoded += b" " * (-len(encoded) % 8)
        (out / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])
        return out


def _config_cases(c: Cases) -> None:
    kind = "config disagrees with the weights"
    c.add("vocab", kind, c.folder("vocab", {"vocab_size": 10**8}),
          r"vocab: .*embed_tokens.weight is \[49152, 64\] in the weights but config.json implies \[100000000, 64\]")
    c.add("layers", kind, c.folder("layers", {"num_hidden_layers": 6}),
          "layers: config.json says num_hidden_layers is 6 but the weights hold 2 layers")
    c.add("kv-heads", kind, c.folder("kv-heads", {"num_key_value_heads": 4}),
          r"kv-heads: the weights do not match config.json: 4 with the wrong shape \(layers.0.self_attn.k_proj")
    c.add("mlp", kind, c.folder("mlp", {"intermediate_size": 96}),
          r"mlp: the weights do not match config.json: 6 with the wrong shape \(layers.0.mlp.gate_proj.weight")
    c.add("untied", kind, c.lying_safetensors("untied", lambda h: h.pop("lm_head.weight")),
          r"untied: the weights do not match config.json: 1 missing \(lm_head.weight\)")
    c.add("heads-zero", kind, c.folder("heads-zero", {"num_attention_heads": 0}),
          "config.json: num_attention_heads is 0; it must be a positive whole number")
    c.add("nosuchmodel", kind, c.folder("nosuchmodel", {"model_type": "nosuchmodel"}),
          "nosuchmodel: config.json says model_type 'nosuchmodel', an architecture transformers .* does not know")


def _file_cases(c: Cases) -> None:
    kind = "damaged config or shard index"
    broken = c.folder("config-broken")
    (broken / "config.json").write_text('{"model_type": "llama",')
    c.add("config-broken", kind, broken, r"config.json is not valid JSON")
    listed = c.folder("config-list")
    (listed / "config.json").write_text("[]")
    c.add("config-list", kind, listed, "config.json holds a JSON list, not an object")
    empty = c.folder("config-empty")
    (empty / "config.json").write_text("")
    c.add("config-empty", kind, empty, "config.json is not valid JSON")
    for name, index, expected in [
        ("index-no-map", {"metadata": {}}, "model.safetensors.index.json has no weight_map"),
        ("index-escape", {"weight_map": {"a": "../../etc/passwd"}}, r"outside the model folder.*\.\./\.\./etc/passwd"),
        ("index-absolute", {"weight_map": {"a": "/etc/passwd"}}, "outside the model folder, which Kvasir refuses: "
                                                                  "/etc/passwd"),
        ("index-missing", {"weight_map": {"a": "model.safetensors", "b": "model-2.safetensors"}},
         "index-missing is missing 1 of its 2 weight shards: model-2.safetensors"),
    ]:
        (c.folder(name) / "model.safetensors.index.json").write_text(json.dumps(index))
        c.add(name, kind, c.root / name, expected)
    not_json = c.folder("index-broken")
    (not_json / "model.safetensors.index.json").write_text("{")
    c.add("index-broken", kind, not_json, "model.safetensors.index.json is not valid JSON")


def _safetensors_cases(c: Cases) -> None:
    kind = "lying or damaged safetensors"
    embed = "model.embed_tokens.weight"

    def beyond(h):
        h["model.norm.weight"]["data_offsets"][1] += 10**12

    def overlap(h):
        h["model.layers.1.input_layernorm.weight"]["data_offsets"] = h["model.norm.weight"]["data_offsets"]

    lies = [
        ("st-no-shape", lambda h: h[embed].pop("shape"), f"tensor '{embed}' has no valid shape"),
        ("st-beyond-end", beyond, "tensor 'model.norm.weight' claims bytes .* but the data has"),
        ("st-size", lambda h: h[embed].update(shape=[49152, 65]), r"is \[49152, 65\] F32 but is given 12,582,912"),
        ("st-overlap", overlap, "overlap"),
        ("st-dtype", lambda h: h[embed].update(dtype="Q9"), "unknown dtype 'Q9'"),
    ]
    for name, lie, expected in lies:
        c.add(name, kind, c.lying_safetensors(name, lie), f"model.safetensors is not a valid safetensors file: "
                                                          f".*{expected}")
    for name, content in [("st-empty", b""), ("st-garbage", b"\xff" * 64)]:
        folder = c.folder(name, weights=False)
        (folder / "model.safetensors").write_bytes(content)
        c.add(name, kind, folder, "model.safetensors is not a valid safetensors file: its header length is impossible")


def _source_cases(c: Cases) -> None:
    kind = "not a usable model source"
    pickled = c.folder("pickled", weights=False)
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    c.add("pickle-folder", kind, pickled, "pytorch_model.bin is a pickle checkpoint, which can run arbitrary code")
    c.add("pickle-file", kind, pickled / "pytorch_model.bin", "pytorch_model.bin is a pickle checkpoint")
    no_config = c.root / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").symlink_to(c.tiny / "model.safetensors")
    c.add("no-config", kind, no_config, "no-config has no config.json")
    (c.root / "notes.txt").write_text("hello")
    c.add("text-file", kind, c.root / "notes.txt", "notes.txt is neither a .gguf file nor a model folder")
    c.add("hub-dots", kind, "a/..", r"no model at 'a/\.\.'")
    only_other = c.folder("consolidated", weights=False)
    (only_other / "consolidated.safetensors").symlink_to(c.tiny / "model.safetensors")
    c.add("consolidated", kind, only_other, "consolidated has no model.safetensors and no index of shards")


def _llama_gguf_tensors(q=(8, 8)):
    """A 2-block llama tensor table (hidden 8, 2 heads, 1 KV head, ff 16, vocab 10), float32, end to end."""
    shapes = {"token_embd.weight": (8, 10)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_q.weight": q, f"blk.{i}.attn_k.weight": (8, 4), f"blk.{i}.attn_v.weight": (8, 4),
                       f"blk.{i}.attn_output.weight": (8, 8), f"blk.{i}.ffn_gate.weight": (8, 16),
                       f"blk.{i}.ffn_up.weight": (8, 16), f"blk.{i}.ffn_down.weight": (16, 8)})
    table, offset = [], 0
    for name, (a, b) in shapes.items():
        table.append((name, (a, b), F32, offset))
        offset += -(-a * b * 4 // 32) * 32
    return table


LLAMA_METADATA = {"general.architecture": "llama", "general.name": "raw", "llama.block_count": 2,
                  "llama.embedding_length": 8, "llama.attention.head_count": 2, "llama.attention.head_count_kv": 1,
                  "llama.feed_forward_length": 16, "llama.vocab_size": 10, "llama.context_length": 64}


def _gguf_cases(c: Cases, tiny_gguf: Path) -> None:
    kind = "damaged or inconsistent GGUF"
    whole = tiny_gguf.read_bytes()
    for name, content, expected in [("cut.gguf", whole[:-1000], "cut.gguf is truncated: its tensors need"),
                                    ("header.gguf", whole[:200], "header.gguf: .*truncated"),
                                    ("empty.gguf", b"", "empty.gguf: it is empty"),
                                    ("zip.gguf", b"PK\x03\x04 a zip file", "zip.gguf is not a GGUF file")]:
        (c.root / name).write_bytes(content)
        c.add(name, kind, c.root / name, expected)
    tensors = _llama_gguf_tensors()
    overlapping = [tensors[0], (tensors[1][0], tensors[1][1], F32, 0), *tensors[2:]]
    raw = [
        ("align0.gguf", {"general.alignment": 0}, tensors, {}, "align0.gguf: general.alignment is 0"),
        ("heads0.gguf", {"llama.attention.head_count": 0}, tensors, {}, "heads0.gguf: llama.attention.head_count is 0"),
        ("type99.gguf", {}, [("token_embd.weight", (8, 10), 99, 0)], {}, "type99.gguf: tensor 'token_embd.weight' "
                                                                         "has type id 99"),
        ("many-tensors.gguf", {}, tensors, {"n_tensors": 2**60}, "claims 1,152,921,504,606,846,976 tensors"),
        ("many-kv.gguf", {}, tensors, {"n_kv": 2**40}, "claims 1,099,511,627,776 metadata entries"),
        ("blocks.gguf", {"llama.block_count": 6}, tensors, {}, "blocks.gguf: its metadata says 6 blocks but its "
                                                               "tensors hold 2"),
        ("vocab.gguf", {"llama.vocab_size": 10**8}, tensors, {}, r"vocab.gguf: .*token_embd.weight is \[8, 10\], "
                                                                 r"expected \[8, 100000000\]"),
        ("q.gguf", {}, _llama_gguf_tensors(q=(8, 6)), {}, r"q.gguf: .*blk.0.attn_q.weight is \[8, 6\], expected"),
        ("overlap.gguf", {}, overlapping, {}, "overlap.gguf: the data of tensors .* overlap"),
        ("nested.gguf", {"general.nested": nested_array_value(10_000)}, tensors, {},
         "nested.gguf: the GGUF header nests arrays more than 32 deep"),
    ]
    for name, metadata, table, counts, expected in raw:
        write_raw_gguf(c.root / name, {**LLAMA_METADATA, **metadata}, table, data_bytes=8192, **counts)
        c.add(name, kind, c.root / name, expected)
    long_key = c.root / "long-key.gguf"
    data = bytearray(write_raw_gguf(long_key, LLAMA_METADATA, tensors, data_bytes=8192).read_bytes())
    data[24:32] = struct.pack("<Q", 2**62)  # the first key's length
    long_key.write_bytes(bytes(data))
    c.add("long-key.gguf", kind, long_key, "long-key.gguf: the GGUF header claims 4,611,686,018,427,387,904 bytes")


def _template_case(c: Cases) -> None:
    folder = c.folder("no-template")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    c.add("no-template", "no chat template", folder, WARNING)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tiny_llama):
    root = tmp_path_factory.mktemp("bad-models")
    cases = Cases(root, tiny_llama)
    for build in (_config_cases, _file_cases, _safetensors_cases, _source_cases, _template_case):
        build(cases)
    _gguf_cases(cases, write_tiny_llama_gguf(tiny_llama, root / "tiny.gguf"))
    specs = root / "cases.json"
    specs.write_text(json.dumps({case_id: spec for case_id, (_, spec, _) in cases.table.items()}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = f"from tests.engine.test_bad_model_files import attempt_all; attempt_all({str(specs)!r})"
    child = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    (root / "outcomes.json").write_text(json.dumps(report, indent=1))  # for reading after a failure
    return cases.table, report["outcomes"]


def test_every_bad_file_is_refused_in_words(outcomes):
    table, results = outcomes
    assert len(table) >= 40
    wrong = []
    for case_id, (_, _, expected) in table.items():
        result = results[case_id]
        if expected == WARNING:
            ok = not result["classes"] and "no chat template" in result["message"]
        else:
            ok = "ModelLoadError" in result["classes"] and re.search(expected, result["message"])
        if not ok:
            wrong.append(f"{case_id}: {result['classes'][:1]} {result['message'][:300]!r} (wanted {expected!r})")
    assert not wrong, "\n".join(wrong)


def test_unknown_architecture_is_unsupported_rather_than_damaged(outcomes):
    _, results = outcomes
    assert results["nosuchmodel"]["classes"][0] == "UnsupportedModelError"


def test_no_attempt_grows_the_peak_memory_by_a_gib(outcomes):
    _, results = outcomes
    worst = max(results, key=lambda case_id: results[case_id]["peak_kib"])
    print(f"\nworst peak growth: {worst} {results[worst]['peak_kib'] / 1024:.0f} MiB over the import baseline")
    assert results[worst]["peak_kib"] < PEAK_LIMIT_KIB
