"""A packaged app ships the native kernels prebuilt: they are found before the user cache, which a user
without a compiler could never fill."""

from engine.step import kernels


def test_a_prebuilt_library_is_preferred_to_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT", tmp_path)
    simd = kernels._simd_flags()
    cached = kernels._library_path(simd)
    assert cached.parent.name == "kernels" and tmp_path not in cached.parents
    (tmp_path / kernels._library_name(simd)).write_bytes(b"\x7fELF")
    assert kernels._library_path(simd) == tmp_path / kernels._library_name(simd)


def test_each_simd_flavour_has_its_own_name():
    names = {kernels._library_name(list(simd)) for simd in kernels.SIMD_FLAVOURS}
    assert len(names) == len(kernels.SIMD_FLAVOURS)
    assert all(name.startswith("kvasir_kernels-") for name in names)
