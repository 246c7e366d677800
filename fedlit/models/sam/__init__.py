"""Medical SAM Adapter on Segment Anything: the model (:mod:`.adapter`), its adapter blocks (:mod:`.blocks`),
SAM/MedSAM checkpoint loading (:mod:`.checkpoint`), prompts (:mod:`.prompts`) and encoder sizes (:mod:`.variants`)."""
