"""ALFWorld and WebShop without their (downloaded) data fail at start-up, saying what to do."""

import pytest

from examples.agent_envs import make_env
from slime.utils.types import Sample


@pytest.fixture(autouse=True)
def no_data_env_vars(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)


def test_alfworld_without_data_says_what_to_download():
    with pytest.raises(FileNotFoundError) as err:
        make_env(None, Sample(metadata={"env": "alfworld", "game_file": "json_2.1.1/train/x/game.tw-pddl"}))
    message = str(err.value)
    assert "alfworld-download" in message and "export ALFWORLD_DATA=" in message and "never downloaded" in message


def test_alfworld_with_a_wrong_folder_names_it(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("ALFWORLD_DATA", str(missing))
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist.*alfworld-download"):
        make_env(None, Sample(metadata={"env": "alfworld", "game_file": "g.tw-pddl"}))
    with pytest.raises(FileNotFoundError, match="game.*not found under"):
        make_env(None, Sample(metadata={"env": "alfworld", "game_file": "g.tw-pddl", "data_dir": str(tmp_path)}))


def test_webshop_without_data_says_what_to_set_up():
    with pytest.raises(FileNotFoundError) as err:
        make_env(None, Sample(metadata={"env": "webshop", "session": 3}))
    message = str(err.value)
    assert "princeton-nlp/WebShop" in message and "setup.sh" in message and "export WEBSHOP_DATA=" in message


def test_webshop_checks_the_checkout_and_its_data(monkeypatch, tmp_path):
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not a WebShop checkout"):
        make_env(None, Sample(metadata={"env": "webshop", "session": 0}))
    (tmp_path / "web_agent_site").mkdir()
    with pytest.raises(FileNotFoundError, match="no product data.*setup script"):
        make_env(None, Sample(metadata={"env": "webshop", "session": 0}))
