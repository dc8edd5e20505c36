"""State on disk: the strategy checkpoint (:mod:`.checkpoint`) and the ``.npz`` store
both it and the clients' persisted state use (:mod:`.npz_store`). No ``flwr`` import."""
