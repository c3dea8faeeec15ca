"""ALFWorld and WebShop without their (downloaded) data fail when the env is built, saying what to do; WebShop's
step on a stand-in for its text env (thinking replies, the step contract)."""

import pytest

from examples.agent_envs import alfworld_env, build_env, webshop_env
from slime.utils.types import Sample


@pytest.fixture(autouse=True)
def no_data_env_vars(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)


def test_alfworld_without_data_says_what_to_download():
    with pytest.raises(FileNotFoundError) as err:
        build_env(Sample(metadata={"env": "alfworld", "game_file": "json_2.1.1/train/x/game.tw-pddl"}), None)
    message = str(err.value)
    assert "alfworld-download" in message and "export ALFWORLD_DATA=" in message and "never downloaded" in message


def test_alfworld_with_a_wrong_folder_names_it(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("ALFWORLD_DATA", str(missing))
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist.*alfworld-download"):
        build_env(Sample(metadata={"env": "alfworld", "game_file": "g.tw-pddl"}), None)
    with pytest.raises(FileNotFoundError, match="game.*not found under"):
        build_env(Sample(metadata={"env": "alfworld", "game_file": "g.tw-pddl", "data_dir": str(tmp_path)}), None)


def test_webshop_without_data_says_what_to_set_up():
    with pytest.raises(FileNotFoundError) as err:
        build_env(Sample(metadata={"env": "webshop", "session": 3}), None)
    message = str(err.value)
    assert "princeton-nlp/WebShop" in message and "setup.sh" in message and "export WEBSHOP_DATA=" in message


def test_webshop_checks_the_checkout_and_its_data(monkeypatch, tmp_path):
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a WebShop checkout"):
        build_env(Sample(metadata={"env": "webshop", "session": 0}), None)
    (tmp_path / "web_agent_site").mkdir()
    with pytest.raises(FileNotFoundError, match="no product data.*setup script"):
        build_env(Sample(metadata={"env": "webshop", "session": 0}), None)


@pytest.mark.parametrize("module,metadata", [(alfworld_env, {"env": "alfworld", "game_file": "g.tw-pddl"}),
                                             (webshop_env, {"env": "webshop", "session": 0})])
def test_each_module_is_an_env_path_of_its_own(module, metadata):
    # Named directly (rollout_interaction_env_path: examples.agent_envs.webshop_env), by upstream's keywords.
    with pytest.raises(FileNotFoundError, match="export"):
        module.build_env(sample=Sample(metadata=metadata), args=None)


class FakeWebShop:
    """WebAgentTextEnv's surface (text mode): search on the first page, then buy the one product."""

    def __init__(self):
        self.actions = []

    def reset(self, session):
        self.page = "search"
        return f"goal {session}: a red mug [Search]", None

    def get_available_actions(self):
        return {"has_search_bar": self.page == "search", "clickables": [] if self.page == "search" else ["buy now"]}

    def step(self, action):
        self.actions.append(action)
        if action.startswith("search["):
            self.page = "results"
            return "red mug [Buy Now]", 0.0, False, None
        if action == "click[buy now]":
            return "Thank you for shopping", 1.0, True, None
        return "nothing happens", 0.0, False, None

    def close(self):
        pass


def test_webshop_steps_on_the_action_after_the_thought(monkeypatch, tmp_path):
    shop = FakeWebShop()
    pool = webshop_env.ResourcePool(lambda: shop, lambda env: None)
    monkeypatch.setattr(webshop_env, "_catalogue_pool", lambda data_dir, num_products: pool)
    env = webshop_env.WebShopTextEnv({"env": "webshop", "session": 4, "max_steps": 4}, tmp_path)
    observation, info = env.reset()
    assert observation == "goal 4: a red mug [Search]" and info == {}
    observation, done, info = env.step("<think>\nsearch[blue mug]? no, red")
    assert "ended inside <think>" in observation and "search[QUERY]" in observation and not done
    assert info == {"reward": 0.0, "success": False, "invalid_action": True} and shop.actions == []
    observation, done, info = env.step("<think>\nred it is\n</think>\n\nsearch[red mug]\n")
    assert (observation, done, info["reward"], info["invalid_action"]) == ("red mug [Buy Now]", False, 0.0, False)
    observation, done, info = env.step("click[buy now]")
    assert done and info == {"reward": 1.0, "success": True, "invalid_action": False}
    assert shop.actions == ["search[red mug]", "click[buy now]"]
    assert env.format_observation(observation) == {"role": "user", "content": observation}
    env.close()
    assert pool.acquire() is shop  # a finished episode hands its catalogue back
