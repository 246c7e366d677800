"""Segmentation: Dice and IoU against hand-worked masks, the loss choices, the networks, and the segmentation
recipe through the ``fedlit`` command."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedlit.cli import main, run
from fedlit.core.errors import ConfigError
from fedlit.data import SyntheticSegmentation
from fedlit.federation import Federation
from fedlit.models import Identity, SmpUnet, TinyUNet
from fedlit.strategies import FedAvg
from fedlit.tasks import ClassificationModule, SegmentationModule

ROOT = Path(__file__).resolve().parents[2]


def masks_4x4() -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted A (4 pixels) and true B (5 pixels) overlapping on 3 pixels, in one 4x4 channel."""
    predicted, true = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4)
    predicted[0, 0, 0, 0:3] = 1  # (0,0) (0,1) (0,2)
    predicted[0, 0, 1, 0] = 1  # (1,0)            |A| = 4
    true[0, 0, 0, 0:3] = 1  # (0,0) (0,1) (0,2): the 3 shared pixels
    true[0, 0, 2, 0:2] = 1  # (2,0) (2,1)      |B| = 5
    return predicted, true


def module(num_classes: int = 1, **kwargs) -> SegmentationModule:
    return SegmentationModule(network=TinyUNet(), num_classes=num_classes, **kwargs)


def test_dice_and_iou_of_a_hand_made_mask_pair():
    # Dice = 2 * 3 / (4 + 5) = 6/9; IoU = 3 / |A u B| = 3 / (4 + 5 - 3) = 3/6
    seg = module()
    seg.reset_metrics()
    seg.update_metrics(*masks_4x4())
    metrics = seg.compute_metrics()
    assert metrics["dice"] == pytest.approx(6 / 9, abs=1e-6)
    assert metrics["iou"] == pytest.approx(3 / 6, abs=1e-6)
    assert "dice_0" not in metrics  # one channel: the mean is the channel
    assert seg.higher_is_better == {"dice": True, "iou": True, "loss": False}
    assert seg.default_selection_metric == "dice"


def _four_images() -> tuple[torch.Tensor, torch.Tensor]:
    """Image 1: the 4x4 pair (|A n B| = 3, |A| = 4, |B| = 5); image 2: a perfect 1-pixel match; image 3: 2 pixels
    predicted on an empty truth (a false positive); image 4: both masks empty."""
    predicted, true = masks_4x4()
    single, two, empty = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4)
    single[0, 0, 3, 3] = 1
    two[0, 0, 3, 2:4] = 1
    return torch.cat([predicted, single, two, empty]), torch.cat([true, single, empty, empty])


@pytest.mark.parametrize(
    ("empty", "reduction", "dice", "iou"),
    [
        # per image: Dice 6/9, 1, 0 (false positive), 1 (both empty) -> mean (2/3 + 1 + 0 + 1) / 4 = 2/3;
        # IoU 1/2, 1, 0, 1 -> 5/8
        ("penalize", "image", 2 / 3, 5 / 8),
        # images 3 and 4 have an empty truth and are left out: Dice (6/9 + 1) / 2 = 5/6, IoU (1/2 + 1) / 2 = 3/4
        ("ignore", "image", 5 / 6, 3 / 4),
        # summed counts: |A n B| = 3 + 1 = 4, |A| = 4 + 1 + 2 = 7, |B| = 5 + 1 = 6 -> Dice 8/13, IoU 4 / (13 - 4)
        ("penalize", "pooled", 8 / 13, 4 / 9),
        # images 1 and 2 only: |A n B| = 4, |A| = 5, |B| = 6 -> Dice 8/11, IoU 4 / (11 - 4)
        ("ignore", "pooled", 8 / 11, 4 / 7),
    ],
)
def test_empty_masks_and_the_reduction_follow_the_chosen_convention(empty, reduction, dice, iou):
    predicted, true = _four_images()
    seg = module(empty=empty, dice_reduction=reduction)
    seg.reset_metrics()
    seg.update_metrics(predicted[:1], true[:1])  # two batches
    seg.update_metrics(predicted[1:], true[1:])
    metrics = seg.compute_metrics()
    assert metrics["dice"] == pytest.approx(dice, abs=1e-9) and metrics["iou"] == pytest.approx(iou, abs=1e-9)
    for only, penalized in ((2, 0.0), (3, 1.0)):  # a false positive alone: 0; both empty alone: 1
        seg.reset_metrics()
        seg.update_metrics(predicted[only : only + 1], true[only : only + 1])
        value = seg.compute_metrics()["dice"]
        assert math.isnan(value) if empty == "ignore" else value == penalized
    seg.reset_metrics()
    assert seg.compute_metrics() == {}


def test_per_image_dice_and_iou_equal_monai_with_and_without_empty_images():
    from monai.metrics import DiceMetric, MeanIoU

    generator = torch.Generator().manual_seed(0)
    predicted = (torch.rand(12, 2, 6, 6, generator=generator) > 0.6).float()
    true = (torch.rand(12, 2, 6, 6, generator=generator) > 0.6).float()
    true[:3], predicted[2:5] = 0, 0  # empty truths, empty predictions, both
    for empty, ignore_empty in (("penalize", False), ("ignore", True)):
        reference = [
            m(y_pred=predicted, y=true).nanmean(dim=0)
            for m in (
                DiceMetric(include_background=True, reduction="none", ignore_empty=ignore_empty),
                MeanIoU(include_background=True, reduction="none", ignore_empty=ignore_empty),
            )
        ]
        seg = module(num_classes=2, empty=empty)
        seg.reset_metrics()
        seg.update_metrics(predicted, true)
        metrics = seg.compute_metrics()
        assert [metrics["dice_0"], metrics["dice_1"]] == pytest.approx(reference[0].tolist(), abs=1e-6)
        assert [metrics["iou_0"], metrics["iou_1"]] == pytest.approx(reference[1].tolist(), abs=1e-6)


def test_two_overlapping_channels_have_their_own_dice_and_iou():
    # channel 0 (disc) as above: Dice 6/9, IoU 1/2. Channel 1 (cup, inside the disc): 2 pixels predicted, 2 true,
    # 1 shared: Dice 2 * 1 / (2 + 2) = 1/2, IoU 1 / 3.
    predicted, true = masks_4x4()
    cup_predicted, cup_true = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 4, 4)
    cup_predicted[0, 0, 0, 0:2] = 1
    cup_true[0, 0, 0, 1:3] = 1
    seg = module(num_classes=2)
    seg.reset_metrics()
    seg.update_metrics(torch.cat([predicted, cup_predicted], 1), torch.cat([true, cup_true], 1))
    metrics = seg.compute_metrics()
    assert metrics["dice_0"] == pytest.approx(6 / 9, abs=1e-6) and metrics["iou_0"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["dice_1"] == pytest.approx(0.5, abs=1e-6) and metrics["iou_1"] == pytest.approx(1 / 3, abs=1e-6)
    assert metrics["dice"] == pytest.approx((6 / 9 + 0.5) / 2, abs=1e-6)
    assert metrics["iou"] == pytest.approx((0.5 + 1 / 3) / 2, abs=1e-6)
    assert seg.higher_is_better == {
        "dice": True,
        "iou": True,
        "dice_0": True,
        "dice_1": True,
        "iou_0": True,
        "iou_1": True,
        "loss": False,
    }


def test_hd95_of_single_pixels_and_named_channels():
    # channel disc: one true pixel at (2, 2), one predicted at (2, 5): every boundary distance is 3, so HD95 = 3.
    # channel cup: identical 2x2 squares: HD95 = 0. A second image predicts nothing for the disc (a complete miss)
    # and matches the cup exactly (0). empty: ignore leaves the miss out: disc 3, cup 0, over channels 1.5.
    # empty: penalize scores the miss the diagonal of the 8x8 image, sqrt(8^2 + 8^2) = sqrt(128): disc
    # (3 + sqrt(128)) / 2, cup 0, over channels (3 + sqrt(128)) / 4.
    predicted, true = torch.zeros(2, 2, 8, 8), torch.zeros(2, 2, 8, 8)
    true[0, 0, 2, 2] = predicted[0, 0, 2, 5] = 1
    true[:, 1, 4:6, 4:6] = predicted[:, 1, 4:6, 4:6] = 1
    true[1, 0, 1, 1] = 1
    seg = module(num_classes=2, hd95=True, class_names=["disc", "cup"], empty="ignore")
    seg.reset_metrics()
    seg.update_metrics(predicted, true)
    metrics = seg.compute_metrics()
    assert metrics["hd95_disc"] == pytest.approx(3.0) and metrics["hd95_cup"] == pytest.approx(0.0)
    assert metrics["hd95"] == pytest.approx(1.5)
    seg = module(num_classes=2, hd95=True, class_names=["disc", "cup"])
    seg.reset_metrics()
    seg.update_metrics(predicted, true)
    metrics = seg.compute_metrics()
    assert metrics["hd95_disc"] == pytest.approx((3 + math.sqrt(128)) / 2) and metrics["hd95_cup"] == 0.0
    assert metrics["hd95"] == pytest.approx((3 + math.sqrt(128)) / 4)
    assert {"dice_disc", "dice_cup", "iou_disc", "iou_cup"} <= set(metrics) and "dice_0" not in metrics
    assert seg.higher_is_better["hd95"] is False and seg.higher_is_better["hd95_cup"] is False
    assert "hd95" not in module().higher_is_better
    with pytest.raises(ConfigError, match=r"class_names=\['disc'\] must be 2 distinct non-empty names"):
        module(num_classes=2, class_names=["disc"])


def test_hd95_penalizes_a_spurious_prediction_and_scores_both_empty_zero():
    # a 3 x 4 image (diagonal sqrt(9 + 16) = 5): image 1 predicts a pixel where the truth is empty (5), image 2
    # has both masks empty (0), image 3 matches one pixel exactly (0): mean 5/3. empty: ignore keeps image 3 only.
    predicted, true = torch.zeros(3, 1, 3, 4), torch.zeros(3, 1, 3, 4)
    predicted[0, 0, 1, 1] = predicted[2, 0, 2, 3] = true[2, 0, 2, 3] = 1
    for empty, expected in (("penalize", 5 / 3), ("ignore", 0.0)):
        seg = module(hd95=True, empty=empty)
        seg.reset_metrics()
        seg.update_metrics(predicted, true)
        assert seg.compute_metrics()["hd95"] == pytest.approx(expected)
    with pytest.raises(
        ConfigError,
        match=r"empty='skip' is not one of \['penalize', 'ignore'\].*"
        r"dice_reduction='global' is not one of \['image', 'pooled'\]",
    ):
        module(empty="skip", dice_reduction="global")


def test_validation_thresholds_the_sigmoid_at_one_half_and_records_the_loss_per_image():
    _, true = masks_4x4()
    seg = module(loss="bce", pos_weight=1.0)
    logits = torch.where(true > 0, 3.0, -3.0)  # right everywhere
    seg.network = torch.nn.Identity()
    seg.reset_metrics()
    seg.validation_step((logits, true), 0)
    metrics = seg.compute_metrics()
    assert metrics["dice"] == pytest.approx(1.0) and metrics["iou"] == pytest.approx(1.0)
    assert metrics["loss"] == pytest.approx(math.log1p(math.exp(-3.0)), rel=1e-5)  # BCE of a logit 3 on its class


def test_the_loss_choices():
    # logits 0 everywhere (probability 1/2), 5 foreground pixels out of 16.
    _, true = masks_4x4()
    logits = torch.zeros_like(true)
    log2 = math.log(2.0)
    # BCE, foreground weighted 2: (5 * 2 * ln 2 + 11 * ln 2) / 16 pixels
    bce = (5 * 2 * log2 + 11 * log2) / 16
    assert module(loss="bce").loss(logits, true).item() == pytest.approx(bce, rel=1e-5)
    assert module(loss="bce", pos_weight=1.0).loss(logits, true).item() == pytest.approx(log2, rel=1e-5)
    # soft Dice loss: 1 - 2 * sum(p * y) / (sum p + sum y) = 1 - 2 * 2.5 / (8 + 5) = 8/13 (MONAI's 1e-5 smoothing)
    assert module(loss="dice").loss(logits, true).item() == pytest.approx(8 / 13, abs=1e-5)
    assert module().loss(logits, true).item() == pytest.approx(bce + 8 / 13, abs=1e-5)  # bce+dice, the default
    with pytest.raises(ConfigError, match=r"model.init_args.loss='focal' is not one of \['bce', 'dice', 'bce\+dice'\]"):
        module(loss="focal")
    with pytest.raises(ConfigError, match="model.init_args.pos_weight=0 must be a number > 0"):
        module(pos_weight=0)
    with pytest.raises(ValueError, match="set model.init_args.num_classes to the mask channels \\(1\\)"):
        module(num_classes=2).loss(torch.zeros(1, 2, 4, 4), true)


def test_networks_map_images_to_logits_of_the_same_size_and_train_entirely():
    seg = module(num_classes=2)
    assert seg(torch.randn(3, 1, 16, 16)).shape == (3, 2, 16, 16)
    roles = seg.parameter_roles()
    assert set(roles.values()) == {"shared"}  # nothing frozen by default
    assert seg.num_trainable_parameters() == sum(p.numel() for p in seg.parameters())
    with pytest.raises(ValueError, match="multiples of 4"):
        seg(torch.randn(1, 1, 18, 18))
    instance = TinyUNet(norm="instance").build(1)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in instance.modules())
    assert instance(torch.randn(2, 1, 8, 8)).shape == (2, 1, 8, 8)
    with pytest.raises(ConfigError, match="norm='group' is not one of"):
        TinyUNet(norm="group")
    smp_unet = SmpUnet(encoder_name="resnet18", encoder_depth=3).build(2)
    assert smp_unet(torch.randn(2, 1, 32, 32)).shape == (2, 2, 32, 32)
    with pytest.raises(ConfigError, match="encoder_weights='imagenet': nothing downloads"):
        SmpUnet(encoder_weights="imagenet")


def test_segmentation_data_with_a_classification_module_is_refused(tmp_path):
    classifier = ClassificationModule(backbone=Identity(num_features=8), num_classes=2)
    data = SyntheticSegmentation(num_clients=2, samples_per_client=10, image_size=16)
    with pytest.raises(
        ConfigError,
        match="model ClassificationModule accepts tasks \\['binary', 'multiclass', "
        "'multilabel'\\] but data SyntheticSegmentation has task 'segmentation'",
    ):
        Federation(classifier, data, FedAvg(), rounds=1, out_dir=tmp_path, progress_bar=False).setup()


def test_segmentation_recipe_raises_the_dice_through_the_cli(tmp_path, capsys):
    results = run(
        [
            "fit",
            "--config",
            str(ROOT / "recipes" / "segmentation_tiny_unet.yaml"),
            "--out_dir",
            str(tmp_path),
            "--federation.progress_bar",
            "false",
        ]
    )
    capsys.readouterr()
    assert results["selection_metric"] == "dice"
    with (tmp_path / "metrics.csv").open() as f:
        mean_dice = {
            int(r["round"]): float(r["value"])
            for r in csv.DictReader(f)
            if r["split"] == "test" and r["metric"] == "dice_mean"
        }
    # pinned (seed 0, 5 rounds): 0.409 after round 1, 0.869 after round 5
    assert mean_dice[1] == pytest.approx(0.409, abs=0.05)
    assert mean_dice[5] == pytest.approx(0.869, abs=0.03)
    assert mean_dice[5] > mean_dice[1] + 0.3 and mean_dice[5] > 0.8
    assert min(v["dice"] for v in results["last"]["clients"].values()) > 0.75
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["task"] == "segmentation" and not (tmp_path / "class_counts.json").exists()


def test_a_download_of_encoder_weights_is_refused_on_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                str(ROOT / "recipes" / "segmentation_tiny_unet.yaml"),
                "--out_dir",
                str(tmp_path),
                "--model.init_args.network",
                "fedlit.models.SmpUnet",
                "--model.init_args.network.init_args.encoder_weights",
                "imagenet",
            ]
        )
    assert exit_info.value.code == 2
    assert "model.init_args.network.init_args.encoder_weights='imagenet': nothing downloads" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_overlay_draws_the_image_in_grey_the_true_outline_in_green_and_the_prediction_in_red():
    from fedlit.tasks.segmentation import overlay

    image = torch.arange(25.0).view(1, 5, 5)  # scaled to [0, 1]: pixel (r, c) -> (5r + c) / 24
    true = torch.zeros(1, 5, 5)
    true[0, 1:4, 1:4] = 1  # a 3x3 square: its 8 border pixels are the outline, the centre (2, 2) is inside
    predicted = torch.zeros(1, 5, 5)
    predicted[0, 2, 2] = predicted[0, 4, 4] = 1
    picture = overlay(image, true, predicted)
    assert picture.shape == (3, 5, 5)
    assert picture[:, 0, 1].tolist() == pytest.approx([1 / 24] * 3)  # background: grey
    assert picture[:, 1, 1].tolist() == [0.0, 1.0, 0.0]  # outline: green
    # predicted, inside the true mask: half grey (12/24) + half red
    assert picture[:, 2, 2].tolist() == pytest.approx([0.25 + 0.5, 0.25, 0.25])
    assert picture[:, 4, 4].tolist() == pytest.approx([0.5 + 0.5, 0.5, 0.5])  # predicted only: 24/24 grey + red


def _one_round(tmp_path: Path, log_images: int) -> EventAccumulator:
    torch.manual_seed(0)
    seg = SegmentationModule(network=TinyUNet(width=4, depth=2), log_images=log_images)
    data = SyntheticSegmentation(
        num_clients=2, samples_per_client=10, image_size=16, batch_size=2, split_fractions=(0.4, 0.4, 0.2)
    )
    Federation(seg, data, FedAvg(), rounds=1, out_dir=tmp_path, progress_bar=False, accelerator="cpu").fit()
    return EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0}).Reload()


def test_validation_overlays_go_to_tensorboard_per_client_and_none_when_off(tmp_path, capsys):
    events = _one_round(tmp_path / "on", log_images=3)
    tags = sorted(events.Tags()["images"])
    assert tags == ["client/site_0/val/overlay", "client/site_1/val/overlay"]
    for tag in tags:
        (image,) = events.Images(tag)
        # 3 of the 4 validation examples, 16 x 16 and 2 pixels apart (batches of 2: the third from the second)
        assert (image.step, image.height, image.width) == (1, 16, 3 * 16 + 2 * 2)
    assert "client/site_0/val/dice" in events.Tags()["scalars"]
    off = _one_round(tmp_path / "off", log_images=0)
    assert off.Tags()["images"] == [] and "client/site_0/val/dice" in off.Tags()["scalars"]
    capsys.readouterr()
    with pytest.raises(ConfigError, match="model.init_args.log_images=-1 must be an integer >= 0"):
        module(log_images=-1)
