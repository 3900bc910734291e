"""A CPU-only build on a machine with an NVIDIA GPU says so in the device reason, and where the CUDA build is."""

import subprocess

import pytest
import torch

from engine import devices
from engine.devices import nvidia_gpu, resolve_device


@pytest.fixture(autouse=True)
def fresh_detection():
    nvidia_gpu.cache_clear()
    yield
    nvidia_gpu.cache_clear()


def test_the_linux_driver_files_name_the_gpu(tmp_path, monkeypatch):
    (tmp_path / "0000:01:00.0").mkdir()
    (tmp_path / "0000:01:00.0" / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   34\n")
    monkeypatch.setattr(devices, "NVIDIA_DRIVER_GPUS", tmp_path)
    monkeypatch.setattr(devices.sys, "platform", "linux")
    assert nvidia_gpu() == "NVIDIA H200"


def test_nvidia_smi_names_the_gpu_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "NVIDIA_DRIVER_GPUS", tmp_path / "none")
    monkeypatch.setattr(devices.sys, "platform", "win32")
    monkeypatch.setattr(devices.shutil, "which", lambda name: "C:/nvidia-smi.exe")
    listing = "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-1234)\n"
    monkeypatch.setattr(devices.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr=""))
    assert nvidia_gpu() == "NVIDIA GeForce RTX 4090"


def test_no_gpu_no_driver_no_tool(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "NVIDIA_DRIVER_GPUS", tmp_path)
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert nvidia_gpu() is None


def test_a_cpu_build_on_a_gpu_machine_says_where_the_cuda_build_is(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(devices, "nvidia_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(devices.sys, "frozen", True, raising=False)
    device, reason = resolve_device("auto")
    assert device.type == "cpu"
    assert "no CUDA in this build" in reason and "NVIDIA H200" in reason
    assert "CUDA build (the -cuda download)" in reason
    monkeypatch.setattr(devices.sys, "frozen", False)
    assert "make install" in resolve_device("auto")[1]


def test_a_cpu_build_without_a_gpu_keeps_its_plain_reason(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(devices, "nvidia_gpu", lambda: None)
    assert resolve_device("auto") == (torch.device("cpu"), "torch was built without CUDA")
