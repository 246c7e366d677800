"""Tasks: FederatedModule subclasses that define losses and metrics."""

from fedlit.tasks.classification import ClassificationModule
from fedlit.tasks.segmentation import SegmentationModule
from fedlit.tasks.survival import CoxModule, concordance_index, cox_loss

__all__ = ["ClassificationModule", "CoxModule", "SegmentationModule", "concordance_index", "cox_loss"]
from fedlit.tasks.clip_prompt import CLIPPromptModule  # noqa: E402

__all__ += ["CLIPPromptModule"]
from fedlit.tasks.multitask import MultiTaskModule  # noqa: E402

__all__ += ["MultiTaskModule"]
from fedlit.tasks.metric_registry import register_metric  # noqa: E402

# The PhysioNet/CinC 2021 challenge score (fedlit.tasks.cinc2021), imported only when a module builds it.
register_metric("cinc2021", "fedlit.tasks.cinc2021:cinc2021_metric", higher_is_better=True)
