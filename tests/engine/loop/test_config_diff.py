"""A resume's configuration check: an option added by an upgrade, at its default, is not a change."""

from __future__ import annotations

import copy

from fedlit.engine.loop.config_diff import config_changes

BEFORE = {
    "model": {
        "class_path": "fedlit.tasks.ClassificationModule",
        "init_args": {"lr": 0.1, "backbone": {"class_path": "fedlit.models.SmallCNN", "init_args": {"width": 16}}},
    },
    "federation": {"rounds": 3},
}


def upgraded(**model_args):
    """BEFORE as a newer fedlit writes it: the module's and the backbone's new options at the given values."""
    now = copy.deepcopy(BEFORE)
    args = now["model"]["init_args"]
    args.update(loss=model_args.get("loss", "default"), extra_metrics=None)
    args["backbone"]["init_args"].update(norm=model_args.get("norm", "batch"), groups=8)
    return now


def test_new_options_at_their_defaults_are_not_changes():
    assert config_changes(BEFORE, upgraded()) == []


def test_new_options_away_from_their_defaults_are_changes():
    assert config_changes(BEFORE, upgraded(loss="asymmetric", norm="group")) == [
        "model.init_args.backbone.init_args.norm",
        "model.init_args.loss",
    ]


def test_a_missing_key_outside_a_class_or_of_an_unknown_class_is_a_change():
    assert config_changes({"federation": {"rounds": 3}}, {"federation": {"rounds": 3, "threads": 1}}) == [
        "federation.threads"
    ]
    before = {"model": {"class_path": "no.such.Module", "init_args": {}}}
    now = {"model": {"class_path": "no.such.Module", "init_args": {"lr": 0.1}}}
    assert config_changes(before, now) == ["model.init_args.lr"]


def test_values_that_differ_are_changes_as_before():
    now = copy.deepcopy(BEFORE)
    now["model"]["init_args"]["lr"] = 0.2
    assert config_changes(BEFORE, now) == ["model.init_args.lr"]
