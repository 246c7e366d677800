"""Cross-silo deployment through Flower's deployment runtime (SuperLink, SuperNodes, ``flwr run``).

- :mod:`fedlit.flower.server`: the ServerApp, the ordinary fedlit loop with a
  :class:`~fedlit.flower.server.FlowerExecutor` and a :class:`~fedlit.flower.remote.RemoteData` (no client data);
- :mod:`fedlit.flower.remote`: how the server reaches the nodes (transports) and its view of their data;
- :mod:`fedlit.flower.clientapp`: the ClientApp (flwr only), which forwards each message to the node's worker
  (:mod:`fedlit.flower.worker`, one long-lived process per SuperNode);
- :mod:`fedlit.flower.client`: one site's client built from the same recipe, and its in-process ClientApp;
- :mod:`fedlit.flower.node_data`: a node's view of its own client's data;
- :mod:`fedlit.flower.snapshots`: where a node keeps its client's store entry between messages;
- :mod:`fedlit.flower.codec`: tensors and extras in Flower records;
- :mod:`fedlit.flower.secagg`: secure aggregation with SecAgg+ (options, strategy checks), its server side in
  :mod:`fedlit.flower.secagg_server` and its client side in :mod:`fedlit.flower.secagg_client`;
- :mod:`fedlit.flower.inprocess`: the same server and clients without Flower's processes (tests);
- :mod:`fedlit.flower.app`: ``fedlit flower-app``, which writes a Flower app folder for a recipe;
- :mod:`fedlit.flower.bundle`: nothing of a run in the bundle ``flwr run`` ships to every node;
- :mod:`fedlit.flower.wait`: ``fedlit flower-wait``, which waits for a run and exits non-zero when it failed.

Needs ``flwr`` (``pip install 'fedlit[flower]'``). See docs/deployment.md.
"""

try:
    import flwr  # noqa: F401
except ImportError as err:  # pragma: no cover  (flwr is in the dev extra)
    raise ImportError("fedlit.flower needs Flower: pip install 'fedlit[flower]' (flwr>=1.40,<1.43).") from err
