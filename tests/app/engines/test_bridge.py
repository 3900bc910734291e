"""EngineBridge with a stand-in AsyncEngine: one load at a time, late loads shut down, failures and restart."""

import asyncio
import threading
from concurrent.futures import Future

import pytest

from app.engines.bridge import EngineBridge
from engine import EngineConfig
from tests.helpers.fake_engine import fake_stats
from tests.helpers.signal_waits import run_until


class StandInEngine:
    """What EngineBridge needs of an AsyncEngine; construction waits for ``release`` when it is given."""

    made: list["StandInEngine"] = []

    def __init__(self, config, *, progress=None, on_failure=None, release=None, fail_with=None):
        if release is not None:
            assert release.wait(10), "the test never released the load"
        if fail_with is not None:
            raise fail_with
        self.config, self.on_failure = config, on_failure
        self.switched: list[EngineConfig] = []
        self.shut_down = threading.Event()
        self.alive = True
        StandInEngine.made.append(self)

    def stats(self, model=None):
        return fake_stats(model_name=self.config.model)

    def all_stats(self):
        return {self.config.model: self.stats()}

    def model_id(self, model=None):
        return self.config.model

    def model_ids(self):
        return [self.config.model]

    async def switch_model(self, config, progress=None, model=None):
        self.switched.append(config)
        self.config = config

    def die(self, reason):
        """As the engine thread would: mark itself dead and report, from another thread."""
        self.alive = False
        thread = threading.Thread(target=self.on_failure, args=(reason,))
        thread.start()
        thread.join()

    def shutdown(self):
        self.shut_down.set()

    def call(self, fn, model=None):
        """Run ``fn`` on a recorder of what the engine was asked, as the engine thread would run it."""
        done = Future()
        done.set_result(fn(self))
        return done

    def set_cpu_options(self, threads, lower_priority):
        self.cpu_options = (threads, lower_priority)

    def set_speculation(self, mode):
        self.speculation = mode


@pytest.fixture
def made():
    StandInEngine.made = []
    return StandInEngine.made


def slow_factory(release, failures=None):
    """A factory whose loads wait for ``release``; ``failures`` lists exceptions for the first loads."""
    failures = list(failures or [])

    def factory(config, **kwargs):
        return StandInEngine(config, release=release, fail_with=failures.pop(0) if failures else None, **kwargs)
    return factory


def test_a_switch_during_the_first_load_waits_for_it_instead_of_loading_twice(qtbot, qloop, made):
    release = threading.Event()
    bridge = EngineBridge(engine_factory=slow_factory(release))
    bridge.start(EngineConfig(model="first"))
    qloop.run_until_complete(bridge.switch(EngineConfig(model="second")))
    qloop.run_until_complete(bridge.switch(EngineConfig(model="third")))  # the latest one asked for wins
    assert made == [] and bridge.loading and not bridge.ready
    loads = []
    bridge.loaded.connect(loads.append)
    release.set()
    run_until(qloop, bridge.loaded, lambda stats: len(loads) == 2)  # the first load, then the switch it waited for
    assert len(made) == 1 and [c.model for c in made[0].switched] == ["third"]
    assert bridge.ready and bridge.config.model == "third"
    bridge.shutdown()
    assert made[0].shut_down.is_set()


def test_shutdown_during_a_load_shuts_the_late_engine_down(qtbot, qloop, made):
    release = threading.Event()
    bridge = EngineBridge(engine_factory=slow_factory(release))
    bridge.start(EngineConfig(model="first"))
    bridge.shutdown()
    release.set()
    qtbot.wait_until(lambda: bool(made), timeout=5000)
    assert made[0].shut_down.wait(5)


def test_a_switch_after_a_failed_first_load_loads_the_new_model(qtbot, qloop, made):
    release = threading.Event()
    release.set()
    bridge = EngineBridge(engine_factory=slow_factory(release, [OSError("no such file: first.gguf")]))
    with qtbot.wait_signal(bridge.load_failed, timeout=5000) as failed:
        bridge.start(EngineConfig(model="first"))
    assert failed.args == ["no such file: first.gguf"] and bridge.load_error == failed.args[0]
    with qtbot.wait_signal(bridge.loaded, timeout=5000):
        qloop.run_until_complete(bridge.switch(EngineConfig(model="second")))
    assert [e.config.model for e in made] == ["second"] and bridge.ready
    bridge.shutdown()


def test_a_switch_during_a_load_that_fails_loads_the_new_model(qtbot, qloop, made):
    release = threading.Event()
    bridge = EngineBridge(engine_factory=slow_factory(release, [OSError("broken")]))
    failed = []
    bridge.load_failed.connect(failed.append)
    bridge.start(EngineConfig(model="first"))
    qloop.run_until_complete(bridge.switch(EngineConfig(model="second")))
    with qtbot.wait_signal(bridge.loaded, timeout=5000):
        release.set()
    assert [e.config.model for e in made] == ["second"] and failed == []
    bridge.shutdown()


def test_a_dead_engine_is_reported_on_the_gui_thread_and_restart_loads_a_fresh_one(qtbot, qloop, made):
    release = threading.Event()
    release.set()
    bridge = EngineBridge(engine_factory=slow_factory(release))
    with qtbot.wait_signal(bridge.loaded, timeout=5000):
        bridge.start(EngineConfig(model="first", device="cpu"))
    threads = []
    bridge.engine_failed.connect(lambda reason: threads.append(threading.current_thread()))
    with qtbot.wait_signal(bridge.engine_failed, timeout=5000) as failed:
        made[0].die("the engine stopped: RuntimeError: boom")
    assert failed.args == ["the engine stopped: RuntimeError: boom"] and threads == [threading.main_thread()]
    assert not bridge.ready and bridge.failure == failed.args[0]
    with qtbot.wait_signal(bridge.loaded, timeout=5000):
        bridge.restart()
    assert made[0].shut_down.is_set() and len(made) == 2
    assert made[1].config == EngineConfig(model="first", device="cpu")
    assert bridge.ready and bridge.failure is None
    bridge.shutdown()


def test_a_late_failure_report_from_a_replaced_engine_is_ignored(qtbot, qloop, made):
    release = threading.Event()
    release.set()
    bridge = EngineBridge(engine_factory=slow_factory(release))
    with qtbot.wait_signal(bridge.loaded, timeout=5000):
        bridge.start(EngineConfig(model="first"))
    with qtbot.wait_signal(bridge.engine_failed, timeout=5000):
        made[0].die("first death")
    with qtbot.wait_signal(bridge.loaded, timeout=5000):
        bridge.restart()
    made[0].on_failure("first death, reported again")
    qloop.run_until_complete(asyncio.sleep(0.01))
    assert bridge.ready and bridge.failure is None
    bridge.shutdown()


def test_cpu_options_reach_the_serving_engine_and_every_later_load(qtbot, qloop, made):
    release = threading.Event()
    bridge = EngineBridge(engine_factory=slow_factory(release))
    bridge.start(EngineConfig(model="first"))
    assert bridge.set_cpu_options(1, True) is None  # still loading: kept for the load that follows
    release.set()
    run_until(qloop, bridge.loaded, lambda stats: True)
    assert bridge.config.threads == 1 and bridge.config.lower_priority
    assert made[-1].config.threads is None and made[-1].cpu_options == (1, True)  # caught up once loaded
    assert bridge.set_cpu_options(None, False).result(10) is None
    assert made[-1].cpu_options == (None, False) and bridge.config.threads is None
    bridge.shutdown()


def test_the_speculation_mode_reaches_the_serving_engine_and_every_later_load(qtbot, qloop, made):
    release = threading.Event()
    bridge = EngineBridge(engine_factory=slow_factory(release))
    bridge.start(EngineConfig(model="first"))
    assert bridge.set_speculation("ngram") is None  # still loading: kept for the load that follows
    release.set()
    run_until(qloop, bridge.loaded, lambda stats: True)
    assert bridge.config.speculation == "ngram" and made[-1].speculation == "ngram"  # caught up once loaded
    bridge.set_speculation("off").result(10)
    assert made[-1].speculation == "off" and bridge.config.speculation == "off"
    bridge.shutdown()
