"""What the algorithms share: the generic aggregation math (:mod:`.aggregate`), the pluggable aggregation rules
(:mod:`.aggregators`) and a client's second, personal copy of its tensors (:mod:`.personal_copy`)."""
