"""SamplingParams refuses bad values when it is made, naming the field, so nothing bad reaches a step."""

import math

import pytest

from engine import SamplingParams

BAD = [
    ("seed", 1.5),
    ("seed", "abc"),
    ("seed", -1),
    ("seed", 2**64),
    ("seed", True),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", -0.1),
    ("temperature", "hot"),
    ("repetition_penalty", math.nan),
    ("repetition_penalty", 0.0),
    ("top_k", 2.5),
    ("top_k", -1),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_p", math.nan),
    ("min_p", -0.5),
    ("min_p", math.nan),
    ("max_tokens", 2.5),
    ("max_tokens", 0),
    ("max_tokens", "10"),
    ("max_tokens", None),
    ("stop", [5]),
    ("stop", (5,)),
    ("stop", [""]),
    ("stop", 5),
    ("stop", ["x"] * 100),
    ("stop_token_ids", [1.5]),
    ("stop_token_ids", [-3]),
    ("stop_token_ids", "12"),
    ("ignore_eos", "yes"),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}"[:40] for f, v in BAD])
def test_bad_value_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_good_values_are_kept_and_normalised():
    params = SamplingParams(max_tokens=7, temperature=0, top_k=3, seed=2**63 - 1, stop="END", stop_token_ids=[4, 9])
    assert params.max_tokens == 7 and params.temperature == 0.0 and isinstance(params.temperature, float)
    assert params.stop == ("END",) and params.stop_token_ids == (4, 9)
    assert params.seed == 2**63 - 1 and params.greedy


def test_integers_pass_as_floats_where_a_number_is_wanted():
    assert SamplingParams(temperature=1, top_p=1, repetition_penalty=2).repetition_penalty == 2.0
