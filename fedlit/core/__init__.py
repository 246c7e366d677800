"""The lowest layer: errors, parameter roles, the client store, the checkpoint file format, seeding and the walk
over nested tensors. It imports nothing else of fedlit; every other layer may import it."""
