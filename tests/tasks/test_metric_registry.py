"""Extra metrics by name: ``register_metric`` and ClassificationModule's ``extra_metrics`` option."""

import pytest
import torch
import torchmetrics

from fedlit.core.errors import ConfigError
from fedlit.tasks import ClassificationModule
from fedlit.tasks.metric_registry import build_metric, register_metric, registered_metrics
from tests.conftest import TinyMLP


class PositiveShare(torchmetrics.Metric):
    """The share of positive targets seen (of class 1 for multiclass): a number easy to work out by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("positive", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("seen", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, probs, target):
        self.positive += (target.reshape(-1) == 1).sum()
        self.seen += target.numel()

    def compute(self):
        return self.positive / self.seen


calls = []


def positive_share(task, num_classes):
    calls.append((task, num_classes))
    return PositiveShare()


register_metric("test_positive_share", positive_share, higher_is_better=False)
register_metric("test_lazy_share", f"{__name__}:positive_share", higher_is_better=True)


def _module(**kwargs):
    return ClassificationModule(backbone=TinyMLP(in_features=4, hidden=3), num_classes=3, **kwargs)


def test_extra_metrics_are_computed_pooled_and_ranked():
    module = _module(extra_metrics=["test_positive_share"])
    assert calls[-1] == ("multiclass", 3)
    module.update_metrics(torch.zeros(4, 3), torch.tensor([1, 0, 2, 1]))
    module.update_metrics(torch.zeros(2, 3), torch.tensor([1, 1]))
    out = module.compute_metrics()
    assert out["test_positive_share"] == pytest.approx(4 / 6)  # four 1s among six targets
    assert out["accuracy"] == pytest.approx(1 / 6)  # all-equal logits pick class 0: one target of six
    module.reset_metrics()
    module.update_metrics(torch.zeros(2, 3), torch.tensor([1, 2]))
    pooled = module.pooled_metrics([module.pooled_predictions()])
    assert pooled["test_positive_share"] == pytest.approx(1 / 2)
    assert module.higher_is_better["test_positive_share"] is False  # what results.json records for the report
    assert module.higher_is_better["accuracy"] is True and module.higher_is_better["loss"] is False
    assert "test_positive_share" not in _module().higher_is_better


def test_lazy_entry_is_imported_when_built():
    before = len(calls)
    module = _module(task="multilabel", extra_metrics=["test_lazy_share"])
    assert calls[before:] == [("multilabel", 3)]
    assert module.higher_is_better["test_lazy_share"] is True
    module.update_metrics(torch.zeros(2, 3), torch.tensor([[1, 0, 0], [1, 1, 0]]))
    assert module.compute_metrics()["test_lazy_share"] == pytest.approx(3 / 6)


def test_unknown_names_and_bad_registrations_are_refused():
    with pytest.raises(
        ConfigError,
        match=r"extra_metrics: 'test_positive_shar' is not a registered metric; .*"
        r"'test_lazy_share', 'test_positive_share'.*closest: 'test_positive_share'",
    ):
        _module(extra_metrics=["test_positive_shar"])
    with pytest.raises(ConfigError, match="names a metric twice"):
        _module(extra_metrics=["test_lazy_share", "test_lazy_share"])
    with pytest.raises(ConfigError, match=r"name='auroc' must be an identifier other than"):
        register_metric("auroc", positive_share, higher_is_better=True)
    with pytest.raises(ConfigError, match=r"factory='no_colon' must be a callable or 'module:attribute'"):
        register_metric("test_other", "no_colon", higher_is_better=True)
    with pytest.raises(ConfigError, match=r"higher_is_better=1 must be true or false"):
        register_metric("test_other", positive_share, higher_is_better=1)
    with pytest.raises(ConfigError, match=r"'test_positive_share' is registered already"):
        register_metric("test_positive_share", positive_share, higher_is_better=True)
    register_metric("test_positive_share", positive_share, higher_is_better=False)  # the same again: nothing changes
    assert {"test_lazy_share", "test_positive_share"} <= set(registered_metrics())
    register_metric("test_missing", "fedlit.tasks:no_such_factory", higher_is_better=True)
    with pytest.raises(ConfigError, match=r"'test_missing': its factory 'fedlit.tasks:no_such_factory' cannot be"):
        build_metric("test_missing", "binary", 1)
