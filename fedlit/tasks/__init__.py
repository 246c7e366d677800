"""Tasks: FederatedModule subclasses that define losses and metrics."""

from fedlit.tasks.classification import ClassificationModule
from fedlit.tasks.segmentation import SegmentationModule
from fedlit.tasks.survival import CoxModule, concordance_index, cox_loss

__all__ = ["ClassificationModule", "CoxModule", "SegmentationModule", "concordance_index", "cox_loss"]
from fedlit.tasks.clip_prompt import CLIPPromptModule  # noqa: E402

__all__ += ["CLIPPromptModule"]
