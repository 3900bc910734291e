"""A packaged app ships the native kernels prebuilt: they are found before the user cache, which a user
without a compiler could never fill."""

import pytest

from engine.step import kernels


def test_a_prebuilt_library_is_preferred_to_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT", tmp_path)
    simd = kernels._simd_flags()
    cached = kernels._library_path(simd)
    assert cached.parent.name == "kernels" and tmp_path not in cached.parents
    (tmp_path / kernels._library_name(simd)).write_bytes(b"\x7fELF")
    assert kernels._library_path(simd) == tmp_path / kernels._library_name(simd)


def test_each_simd_flavour_has_its_own_name():
    names = {kernels._library_name(list(each.flags)) for each in kernels.SIMD_FLAVOURS}
    assert len(names) == len(kernels.SIMD_FLAVOURS)
    assert all(name.startswith("kvasir_kernels-") for name in names)


def test_the_fastest_flavour_the_cpu_runs_is_chosen(monkeypatch):
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    everything = {need: True for each in kernels.SIMD_FLAVOURS for need in each.needs}
    for features, want in [(everything, "AVX-512 VNNI"), ({**everything, "avx512_vnni": False}, "AVX2"),
                           ({**everything, "avx512_vnni": False, "f16c": False}, "portable C++"), ({}, "portable C++")]:
        monkeypatch.setattr(kernels, "_cpu_features", lambda features=features: features)
        assert kernels.flavour().name == want
    monkeypatch.setattr(kernels.platform, "machine", lambda: "arm64")
    assert kernels.flavour().name == "portable C++"


def test_a_flavour_can_be_asked_for_by_name_among_those_the_cpu_runs(monkeypatch):
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    avx2_only = {need: True for need in kernels.SIMD_FLAVOURS[1].needs}
    monkeypatch.setattr(kernels, "_cpu_features", lambda: avx2_only)
    monkeypatch.setenv(kernels.FLAVOUR_ENV, "portable c++")
    assert kernels.flavour().name == "portable C++"
    monkeypatch.setenv(kernels.FLAVOUR_ENV, "AVX-512 VNNI")
    with pytest.raises(ValueError, match="not one this CPU runs"):
        kernels.flavour()
