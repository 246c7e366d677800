"""The federation settings of the server's screening of uploads, each declared once (see
:mod:`fedlit.engine.loop.screening` for what they bound, and :func:`~fedlit.engine.loop.settings_doc.setting`).

:class:`~fedlit.engine.loop.settings.Settings` takes each declaration below as the default of its field of the same
name, in the order the docs' table shows them; :func:`screening_problems` is what their bounds cannot say.
"""

from __future__ import annotations

from typing import Any

from fedlit.engine.loop.settings_doc import setting

MAX_UPDATE_NORM: Any = setting(
    None,
    "The largest L2 norm of a client's update (its uploaded shared tensors minus what the server sent it) "
    "that the server aggregates; a larger one is rejected (left out of the round, a fault), or clipped to it with "
    "``update_norm_action: clip``. None, the default: no absolute bound. See :mod:`fedlit.engine.loop.screening`.",
    above=0,
    note="or null: no bound",
    resumable=True,
)
MAX_UPDATE_RATIO: Any = setting(
    1000.0,
    "The largest update norm relative to the size of what the client was sent (its L2 norm, at least "
    "1); a larger one is rejected. 1000 by default catches a scaled or corrupted upload long before its "
    "aggregate overflows; None: no relative bound.",
    above=0,
    note="or null: no bound",
    resumable=True,
)
MAX_UPDATE_NORM_VS_MEDIAN: Any = setting(
    None,
    "The largest update norm relative to the round: k rejects (or, with ``update_norm_action: clip``, scales down "
    "to the bound) an update whose L2 norm is over k times the median norm of the round's other updates (norm "
    'bounding, Sun et al., "Can you really backdoor federated learning?", 2019). The others\' median, not the '
    "round's: with 2 clients no update is ever over 2 times the round's median. A round of one update is not "
    "checked. None, the default in a simulation: off; a Flower deployment's default is 10 (from honest rounds of "
    "its recipes: see ``docs/deployment.md``).",
    low=1,
    note="or null: no bound",
    resumable=True,
)
UPDATE_NORM_ACTION: Any = setting(
    "reject",
    "What the norm bounds ``max_update_norm`` and ``max_update_norm_vs_median`` do with an update over them: "
    "``reject`` (the default) leaves it out of the round (a fault); ``clip`` scales the update (what the client "
    "uploaded minus what it was sent) down to the bound and aggregates it, recorded as a ``clipped`` fault.",
    resumable=True,
)
MAX_CLIENT_WEIGHT: Any = setting(
    None,
    "The largest share of a round's training examples one client may weigh: its ``num_examples`` over the sum of "
    "the round's selected clients' train sizes (the others' as their data declared them, at the start of a "
    "deployment); an update over it is rejected (left out of the round, a fault). A round of one client is not "
    "checked (its weight is 1 whatever its size). None, the default: no cap.",
    above=0,
    note="or null: no cap",
    resumable=True,
)


def screening_problems(values: dict[str, Any]) -> list[str]:
    """What the declared bounds of the screening settings ``values`` cannot say, each naming the option."""
    share = values["max_client_weight"]
    if isinstance(share, int | float) and not isinstance(share, bool) and share > 1:
        return [f"federation.max_client_weight={share} must be a share in (0, 1] (or null: no cap)"]
    return []
