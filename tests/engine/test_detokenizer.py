"""Streaming text: no half characters, no lost spaces, no stop strings."""

import pytest
from transformers import AutoTokenizer

from engine.step.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello world, how are you?  Two spaces, then\nnew lines\n\n  and indents.",
    "Emoji 🎉🚀 and accents: café, naïve, Ångström; CJK: 日本語のテキスト.",
    "def f(x):\n    return x ** 2  # code",
]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def stream(tokenizer, text, stop=()):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:", add_special_tokens=False), stop)
    deltas = []
    for token in ids:
        detok.add(token)
        deltas.append(detok.release())
        if detok.stopped:
            break
    deltas.append(detok.release(final=True))
    return deltas, detok


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_decode(tokenizer, text):
    deltas, _ = stream(tokenizer, text)
    assert "".join(deltas) == tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_is_cut_and_never_released(tokenizer):
    text = "The answer is 42. END of the reply"
    deltas, detok = stream(tokenizer, text, stop=("END",))
    assert detok.stopped and "".join(deltas) == "The answer is 42. "
    assert all("E" not in d for d in deltas)


def test_possible_stop_prefix_is_held_back_then_released(tokenizer):
    deltas, detok = stream(tokenizer, "alpha beta gamma", stop=("gamut",))
    assert not detok.stopped
    assert "".join(deltas) == "alpha beta gamma"
    assert not "".join(deltas[:-1]).endswith("gam")  # "gam" might have been the start of "gamut"
