import pytest

from engine import Engine, EngineConfig


@pytest.fixture(scope="session")
def default_engine():
    """The real default model in float32 on the CPU, loaded once for the integration tests."""
    return Engine(EngineConfig(model="default", quantization="none", dtype="float32", device="cpu", num_kv_blocks=1024))
