"""The data-set infrastructure every data set builds on: the ``FederatedDataModule`` API (:mod:`.datamodule`), the
tensor pool (:mod:`.pool`) and file-backed samples (:mod:`.samples`), partitioners (:mod:`.partition`), per-client
splits (:mod:`.splits`), the segmentation sites' shared options (:mod:`.site_options`) and (image, mask) pairs
(:mod:`.segmentation_pairs`), and UTF-8 text files (:mod:`.text`). The data sets themselves are the other modules of
:mod:`fedlit.data`."""
