"""Federation settings that no run could honour are refused at setup, naming the option, the value and the fix:
a ``min_clients`` no round could reach, a ``seed`` torch and numpy refuse."""

from __future__ import annotations

import pytest

from fedlit import FedAvg
from fedlit.core.errors import ConfigError
from tests.conftest import make_federation


def test_min_clients_above_the_clients_that_train_is_refused_at_setup(tmp_path):
    federation = make_federation(tmp_path, FedAvg(), rounds=1, min_clients=5)
    with pytest.raises(ConfigError, match=r"federation.min_clients=5 but the data has only 3 clients that train"):
        federation.fit()
    assert not (tmp_path / "results.json").exists()


def test_min_clients_above_clients_per_round_is_refused_at_setup(tmp_path):
    federation = make_federation(tmp_path, FedAvg(), rounds=1, min_clients=3, clients_per_round=2)
    with pytest.raises(ConfigError) as info:
        federation.fit()
    message = str(info.value)
    assert "federation.min_clients=3 but a round selects only 2 clients (federation.clients_per_round=2)" in message
    assert "raise federation.clients_per_round" in message


def test_min_clients_equal_to_the_clients_of_a_round_runs(tmp_path):
    results = make_federation(tmp_path, FedAvg(), rounds=1, min_clients=2, clients_per_round=2).fit()
    assert results["last"]["round"] == 1


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_out_of_range_seed_names_the_option(tmp_path, seed):
    with pytest.raises(ConfigError, match=rf"federation.seed={seed} must be in \[0, 2\*\*32\)"):
        make_federation(tmp_path, FedAvg(), rounds=1, seed=seed).fit()


def test_out_of_range_seed_in_a_recipe_is_one_line(tmp_path, capsys):
    from fedlit.cli import main
    from tests.test_cli import QUICK

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *QUICK, "--out_dir", str(tmp_path), "--federation.seed", "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlit: error: ") and "federation.seed=-1 must be in [0, 2**32)" in err
