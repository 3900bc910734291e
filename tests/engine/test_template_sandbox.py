"""Chat templates render in worker processes, as transformers renders them, within time, memory and size limits."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.serving.prompt_encoder import PromptEncoder
from engine.templates.chat_template import ChatTemplate
from engine.templates.frames import read_frame, write_frame
from engine.templates.sandbox import (
    SandboxError,
    TemplateError,
    TemplateLimitError,
    TemplateSandbox,
    TemplateTooLong,
    worker_command,
)

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
HELLO = [{"role": "user", "content": "Hello!"}]
FOR_EVER = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
STRING_BOMB = ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
               "{{ ns.s | length }}")
CHATS = [
    HELLO,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, with <|im_end|> in it"}],
    [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Autumn moon,"}],  # continued
]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def sandbox():
    """A sandbox of its own, with a short deadline so that the runaway templates here end quickly."""
    sandbox = TemplateSandbox(timeout_s=1.0)
    yield sandbox
    sandbox.close()


def render(sandbox: TemplateSandbox, template: str, max_chars: int = 100_000) -> str:
    return sandbox.render(template, HELLO, variables={}, add_generation_prompt=True, continue_final_message=False,
                          max_chars=max_chars)


@pytest.mark.parametrize("chat", CHATS, ids=["one-message", "four-messages", "continued"])
def test_text_and_ids_are_what_transformers_makes_of_the_chat(tokenizer, sandbox, chat):
    continuing = chat[-1]["role"] == "assistant"
    expected = dict(add_generation_prompt=not continuing, continue_final_message=continuing)
    assert ChatTemplate(tokenizer, sandbox).render(chat, 100_000) == tokenizer.apply_chat_template(
        chat, tokenize=False, **expected)
    ids = PromptEncoder(tokenizer, 2048, len(tokenizer), sandbox).encode(chat)
    assert ids == tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False, **expected)


def test_a_template_that_loops_for_ever_is_stopped_at_its_deadline_and_the_next_render_works(sandbox):
    with pytest.raises(TemplateLimitError, match="took longer than 1 s"):
        render(sandbox, FOR_EVER)
    assert render(sandbox, "{{ messages[0].content }}") == "Hello!"


def test_a_string_bomb_is_stopped_at_the_memory_cap():
    sandbox = TemplateSandbox(timeout_s=100.0)  # the memory cap stops it, however slow the machine is today
    try:
        with pytest.raises(TemplateLimitError, match="needed more than 1 GiB of memory"):
            render(sandbox, STRING_BOMB)
        assert render(sandbox, "{{ messages | length }}") == "1"
    finally:
        sandbox.close()


def test_text_past_the_callers_limit_is_refused_saying_how_much_was_written(sandbox):
    with pytest.raises(TemplateTooLong, match="wrote 2,000 characters, more than the 1,000 allowed") as refused:
        render(sandbox, "{% for i in range(200) %}0123456789{% endfor %}", max_chars=1000)
    assert refused.value.chars == 2000


@pytest.mark.parametrize(("template", "words"), [
    ("{{ raise_exception('System role not supported') }}", "System role not supported"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "calls itself too deeply"),
    ("{% for %}", "Expected an expression"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
])
def test_a_template_that_refuses_or_is_broken_says_so_in_its_own_words(sandbox, template, words):
    with pytest.raises(TemplateError, match=words) as refused:
        render(sandbox, template)
    assert not isinstance(refused.value, TemplateLimitError)


def test_a_stuck_render_holds_up_no_other():
    sandbox = TemplateSandbox(timeout_s=60.0)
    sandbox.start()
    workers = list(sandbox._idle)
    for worker in workers:
        worker.wait_ready()
    outcome = []
    stuck = threading.Thread(target=lambda: outcome.append(pytest.raises(TemplateError, render, sandbox, FOR_EVER)))
    stuck.start()
    assert render(sandbox, "{{ messages[0].role }}") == "user"
    assert stuck.is_alive(), "the quick render should not have waited for the stuck one"
    for worker in workers:
        worker.process.kill()  # ends the stuck render now rather than at its deadline
    stuck.join()
    sandbox.close()
    assert outcome


def test_closing_the_sandbox_ends_its_workers():
    sandbox = TemplateSandbox()
    render(sandbox, "{{ 1 }}")
    processes = [worker.process for worker in sandbox._idle]
    sandbox.close()
    assert processes and all(process.poll() is not None for process in processes)
    with pytest.raises(SandboxError, match="shut down"):
        render(sandbox, "{{ 1 }}")


def test_the_frozen_app_starts_its_workers_through_its_own_entry_point(monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert worker_command() == [sys.executable, "--template-worker"]
    entry = subprocess.Popen([sys.executable, str(ROOT / "packaging" / "kvasir_main.py"), "--template-worker"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert read_frame(entry.stdout) == {"ready": True}
    write_frame(entry.stdin, {"template": "{{ messages[0].content | upper }}", "messages": HELLO, "variables": {},
                              "add_generation_prompt": True, "continue_final_message": False, "max_chars": 100,
                              "cpu_s": 5})
    assert read_frame(entry.stdout) == {"text": "HELLO!"}
    entry.stdin.close()
    assert entry.wait(timeout=60) == 0


def test_a_worker_imports_neither_torch_nor_the_engine():
    """A worker's start is what a first render waits for: the engine package imports its parts on first use."""
    probe = ("import sys; import engine.templates.worker; "
             "print(sorted(m for m in ('torch', 'engine.serving.engine', 'engine.models.fit') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
