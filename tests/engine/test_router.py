"""Routing rules: what matches, why in words, resident models first, the fallback, stickiness, and the JSON
shape the settings and ``--routes`` files use."""

from __future__ import annotations

import pytest

from engine.routing.router import Request, Router, Routes, Rule, has_code, task_kind

RESIDENT = ["small", "large"]


def ask(text: str, history: list[dict] | None = None, needs=()) -> Request:
    return Request.of([*(history or []), {"role": "user", "content": text}], needs)


def route(routes: Routes, request: Request, resident=RESIDENT, router: Router | None = None, **kw):
    return (router or Router(routes)).route(request, resident, "small", **kw)


def test_each_condition_matches_and_says_why():
    cases = [
        (Rule("large", min_chars=10), "a" * 12, "the message is 12 characters (at least 10)"),
        (Rule("large", max_chars=5), "abc", "the message is 3 characters (at most 5)"),
        (Rule("large", has_code=True), "look:\n```py\nx = 1\n```", "the message has code"),
        (Rule("large", keywords=("explain", "step by step")), "Please EXPLAIN this.", "the message says 'explain'"),
        (Rule("large", keywords=("step by step",)), "go step by step", "the message says 'step by step'"),
        (Rule("large", min_chars=3, has_code=False), "hello", "the message is 5 characters (at least 3) and the "
                                                              "message has no code"),
    ]
    for rule, text, why in cases:
        decision = route(Routes([rule], "small"), ask(text))
        assert (decision.model, decision.reason, decision.rule) == ("large", why, 0), rule


def test_a_rule_that_does_not_match_leaves_it_to_the_fallback():
    routes = Routes([Rule("large", min_chars=100), Rule("large", keywords=("prove",)),
                     Rule("large", has_code=True)], "small")
    decision = route(routes, ask("hi, improve this"))  # "improve" holds "prove", but not as a word
    assert (decision.model, decision.reason, decision.rule) == ("small", "no rule matched: the fallback", None)


def test_the_conversation_and_the_needs_are_conditions():
    history = [{"role": "user", "content": "x" * 500}, {"role": "assistant", "content": "y" * 500}]
    routes = Routes([Rule("large", min_context_chars=1000)], "small")
    assert route(routes, ask("ok", history)).model == "large"
    assert route(routes, ask("ok")).model == "small"
    routes = Routes([Rule("large", needs="json")], "small")
    assert route(routes, ask("hi", needs=("json",))).reason == "the request needs json"
    assert route(routes, ask("hi")).model == "small"


def test_resident_models_are_preferred():
    routes = Routes([Rule("huge", has_code=True), Rule("large", has_code=True)], "small")
    decision = route(routes, ask("```x```"))
    assert (decision.model, decision.rule) == ("large", 1)
    decision = route(Routes([Rule("huge", has_code=True)], "small"), ask("```x```"))
    assert decision.model == "small"
    assert decision.reason == "no rule matched: the fallback (huge would have answered but is not loaded)"
    decision = route(Routes([Rule("huge", has_code=True)], "gone"), ask("hi"))
    assert (decision.model, decision.reason) == ("small", "no rule matched and no fallback is loaded: the primary "
                                                          "model")


def test_names_resolve_to_resident_ids():
    routes = Routes([Rule("default@none", has_code=True)], "default")
    ids = {"default@none": "Smol@none", "default": "Smol"}
    decision = Router(routes).route(ask("```x```"), ["Smol", "Smol@none"], "Smol", ids.get)
    assert decision.model == "Smol@none"


def test_routing_is_sticky_within_a_conversation_unless_asked():
    router = Router(Routes([Rule("large", has_code=True)], "small"))
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert route(router.routes, Request.of(first), router=router).model == "small"
    later = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "```code```"}]
    decision = route(router.routes, Request.of(later), router=router)
    assert (decision.model, decision.reason) == ("small", "earlier turns of this conversation ran on small")
    assert route(router.routes, Request.of(later), router=router, fresh=True).model == "large"
    # another conversation (another system prompt) is routed on its own
    other = [{"role": "system", "content": "be long"}, *later[1:]]
    assert route(router.routes, Request.of(other), router=router).model == "large"
    # a model no longer resident is not stuck to
    decision = router.route(Request.of(later), ["small2", "large"], "small2")
    assert decision.model == "large"
    router.routes.sticky = False
    assert route(router.routes, Request.of(later), router=router).model == "large"


def test_code_is_recognised():
    assert has_code("```\nx\n```")
    assert has_code("def f(x):\n    return x\nimport os\n")
    assert not has_code("What is the capital of France? Tell me about its history.")


def test_routes_round_trip_through_json():
    routes = Routes([Rule("large", has_code=True), Rule("large", keywords=("why",), min_chars=3)], "small", False)
    assert Routes.from_dict(routes.to_dict()) == routes


@pytest.mark.parametrize(("data", "message"), [
    ([], "routes must be a JSON object"),
    ({"rules": {}}, "'rules' must be a list"),
    ({"rules": [{"model": "a", "min_chars": -1}]}, "rule 1: min_chars must be a whole number of characters"),
    ({"rules": [{"model": "a", "colour": "red"}]}, "rule 1: unknown field(s) colour"),
    ({"rules": [{"model": "a"}]}, "rule 1: the rule for a sets no condition"),
    ({"rules": [{"model": "a", "needs": "wings"}]}, "rule 1: needs must be one of tools, json"),
    ({"rules": [{"has_code": True}]}, "rule 1:"),
    ({"fallback": 3}, "'fallback' must be a model's name"),
    ({"route": []}, "unknown field(s) in the routes: route"),
])
def test_bad_routes_are_refused_in_words(data, message):
    with pytest.raises(ValueError) as caught:
        Routes.from_dict(data)
    assert message in str(caught.value)


def test_default_routes_send_hard_requests_to_the_largest_model():
    routes = Routes.default_for({"small": 100, "large": 400})
    assert route(routes, ask("```x = 1```")).model == "large"
    assert route(routes, ask("Why is the sky blue?")).model == "large"
    assert route(routes, ask("Write a Python function that adds two numbers.")).model == "large"
    assert route(routes, ask("a" * 700)).model == "large"
    assert route(routes, ask("Hello!")).model == "small"
    assert Routes.default_for({"only": 1}) == Routes([], "only")


def test_the_kind_of_task_is_guessed_right_for_every_shipped_task():
    from engine.routing.evaluation import TaskSet

    assert [task_kind(t.prompt) for t in TaskSet.shipped().tasks] == [t.category for t in TaskSet.shipped().tasks]
    assert task_kind("How many moons has Mars?") == "factual" and task_kind("2 + 2?") == "arithmetic"
    assert task_kind("Fix this:\n```js\nlet x = 1\n```") == "code"


def test_min_score_routes_by_the_evaluated_accuracy_on_the_kind_of_task():
    routes = Routes([Rule("large", min_score=0.5)], "small")
    scores = {"large": {"arithmetic": 0.75, "code": 0.25}, "small": {"arithmetic": 0.0, "code": 0.25}}
    router = Router(routes, scores)
    decision = router.route(ask("What is 6 times 7?"), ["small", "large"], "small")
    assert decision.model == "large"
    assert decision.reason == "large answered 75% of the arithmetic tasks right (at least 50%)"
    assert router.route(ask("Write a Python function"), ["small", "large"], "small").model == "small"
    assert Router(routes).route(ask("What is 6 times 7?"), ["small", "large"], "small").model == "small"  # unscored
    with pytest.raises(ValueError, match="min_score must be a share of tasks from 0 to 1, not 75"):
        Routes.from_dict({"rules": [{"model": "large", "min_score": 75}]})
    assert Routes.from_dict(routes.to_dict()) == routes
