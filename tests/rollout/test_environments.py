"""Environments by name, or a user's own class from a file, built with checked options."""

import textwrap

import pytest

from posttrain.agents import Environment
from posttrain.agents.search import SearchEnv
from posttrain.rollout.environments import env_factory, load_env_class

USER_ENV = textwrap.dedent('''
    from posttrain.agents import Environment, StepInfo, StepResult

    class Echo(Environment):
        name = "echo"

        def __init__(self, word: str = "done"):
            self.word = word

        def reset(self, sample):
            return "say " + self.word

        def step(self, action):
            done = self.word in action
            return StepResult("again", float(done), done, StepInfo(valid=True, effective=done, success=done))

    class NotAnEnv:
        pass
''')


def test_builtin_search_env_by_name():
    assert load_env_class("search") is SearchEnv


def test_unknown_name_says_how_to_bring_your_own():
    with pytest.raises(ValueError, match="env.path.*env.class_name"):
        load_env_class("chess")


def test_user_environment_from_a_file(tmp_path):
    path = tmp_path / "my_envs.py"
    path.write_text(USER_ENV)
    echo = load_env_class("echo", str(path), "Echo")
    assert issubclass(echo, Environment)
    env = env_factory(echo, {"word": "stop"}, {})()
    assert env.reset(None) == "say stop"
    assert env.step("I stop").done and not env.step("go").done
    with pytest.raises(ValueError, match="not a subclass"):
        load_env_class("x", str(path), "NotAnEnv")
    with pytest.raises(ValueError, match="no such file"):
        load_env_class("x", str(tmp_path / "missing.py"), "Echo")
    with pytest.raises(ValueError, match="needs env.class_name"):
        load_env_class("x", str(path), None)


def test_options_are_checked_before_any_episode_and_resources_go_where_asked(tmp_path):
    with pytest.raises(ValueError, match=r"\['colour'\] are not options of SearchEnv"):
        env_factory(SearchEnv, {"colour": "red"}, {"retriever": object()})
    with pytest.raises(ValueError, match=r"cannot construct SearchEnv: it needs \['retriever'\]"):
        env_factory(SearchEnv, {"topk": 2}, {})  # no retriever to give it
    retriever = object()
    env = env_factory(SearchEnv, {"topk": 2}, {"retriever": retriever, "unused": 1})()
    assert env.retriever is retriever
